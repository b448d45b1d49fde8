"""/api/observers"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, status

from manager import queries
from manager.api.deps import CommandsDep, SessionDep
from manager.api.schemas import ObserverCreate, ObserverOut, ObserverPage
from manager.db.models import ObserverStatus

router = APIRouter(prefix="/api/observers", tags=["observers"])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ObserverOut)
async def create_observer(body: ObserverCreate, commands: CommandsDep) -> ObserverOut:
    observer = await commands.create(name=body.name, kind=body.kind, args=body.args, pool=body.pool)
    return ObserverOut.of(observer)


@router.get("", response_model=ObserverPage)
async def list_observers(
    session: SessionDep,
    status_: Annotated[ObserverStatus | None, Query(alias="status")] = None,
    kind: str | None = None,
    pool: str | None = None,
    service_id: uuid.UUID | None = None,
    name: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: str | None = None,
) -> ObserverPage:
    flt = queries.ObserverFilter(status=status_, kind=kind, pool=pool, service_id=service_id, name=name)
    rows, next_cursor = await queries.list_observers(session, flt, limit, cursor)
    return ObserverPage(items=[ObserverOut.of(obs, svc) for obs, svc in rows], next_cursor=next_cursor)


@router.get("/{observer_id}", response_model=ObserverOut)
async def get_observer(observer_id: uuid.UUID, session: SessionDep) -> ObserverOut:
    observer, service_name = await queries.get_observer(session, observer_id)
    return ObserverOut.of(observer, service_name)


@router.delete("/{observer_id}", status_code=status.HTTP_202_ACCEPTED, response_model=ObserverOut)
async def stop_observer(observer_id: uuid.UUID, commands: CommandsDep) -> ObserverOut:
    return ObserverOut.of(await commands.stop(observer_id))
