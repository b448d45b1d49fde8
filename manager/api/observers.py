"""/api/observers"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, status

from manager.api.deps import CommandsDep, SessionDep
from manager.api.schemas import (
    ERRORS,
    BulkCreate,
    BulkStop,
    BulkStopResult,
    EventOut,
    ObserverCreate,
    ObserverList,
    ObserverOut,
    ObserverPage,
    Reschedule,
)
from manager.db import observers
from manager.db.events import list_events
from manager.db.models import ObserverStatus
from manager.kinds import NewObserver

router = APIRouter(prefix="/api/observers", tags=["observers"], responses=ERRORS)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ObserverOut)
async def create_observer(body: ObserverCreate, commands: CommandsDep) -> ObserverOut:
    observer = await commands.create(_spec(body))
    return ObserverOut.of(observer)


def _spec(body: ObserverCreate) -> NewObserver:
    return NewObserver(
        body.name,
        body.kind,
        body.args,
        body.pool,
        body.retry_fields(),
        body.isolation,
        body.memory_limit_mb,
        body.start_at,
        body.stop_at,
        body.run_for_s,
        body.rebalance,
    )


@router.post("/bulk", status_code=status.HTTP_201_CREATED, response_model=ObserverList)
async def create_observers(body: BulkCreate, commands: CommandsDep) -> ObserverList:
    """Create up to 1,000 observers at once: same validation as a single create, all or nothing."""
    specs = [_spec(o) for o in body.observers]
    return ObserverList(items=[ObserverOut.of(o) for o in await commands.create_many(specs)])


@router.post("/bulk-stop", status_code=status.HTTP_202_ACCEPTED, response_model=BulkStopResult)
async def stop_observers(body: BulkStop, commands: CommandsDep) -> BulkStopResult:
    """Stop up to 10,000 observers at once. Unknown and already final ids are listed, not refused."""
    result = await commands.stop_many(body.ids)
    return BulkStopResult(
        stopping=result.stopping, final=result.final, unknown=result.unknown, cancelled=result.cancelled
    )


@router.get("", response_model=ObserverPage)
async def list_observers(
    session: SessionDep,
    status_: Annotated[ObserverStatus | None, Query(alias="status")] = None,
    kind: str | None = None,
    pool: str | None = None,
    service_id: uuid.UUID | None = None,
    name: Annotated[str | None, Query(description="exact name")] = None,
    q: Annotated[str | None, Query(max_length=200, description="a substring of the name, any case")] = None,
    sort: observers.Sort = observers.Sort.CREATED,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> ObserverPage:
    """Keyset pages: pass ``next_cursor`` back (with the same filters and sort) for the next."""
    flt = observers.ObserverFilter(status=status_, kind=kind, pool=pool, service_id=service_id, name=name, q=q)
    rows, next_cursor = await observers.list_observers(session, flt, limit, cursor, sort)
    return ObserverPage(items=[ObserverOut.of(obs, svc) for obs, svc in rows], next_cursor=next_cursor)


@router.get("/{observer_id}", response_model=ObserverOut)
async def get_observer(observer_id: uuid.UUID, session: SessionDep) -> ObserverOut:
    observer, service_name = await observers.get_observer(session, observer_id)
    return ObserverOut.of(observer, service_name)


@router.get("/{observer_id}/events", response_model=list[EventOut])
async def observer_events(
    observer_id: uuid.UUID,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[int | None, Query(description="id of the last event already seen")] = None,
) -> list[EventOut]:
    """The observer's history, oldest first (created, started on X, moved from X to Y, ...)."""
    await observers.get_observer(session, observer_id)  # 404 for an unknown id
    return [EventOut.of(e) for e in await list_events(session, observer_id, limit, after)]


@router.post("/{observer_id}/restart", status_code=status.HTTP_202_ACCEPTED, response_model=ObserverOut)
async def restart_observer(observer_id: uuid.UUID, commands: CommandsDep) -> ObserverOut:
    """Publish a fresh start for a Failed observer (409 for any other status)."""
    return ObserverOut.of(await commands.restart(observer_id))


@router.delete("/{observer_id}", status_code=status.HTTP_202_ACCEPTED, response_model=ObserverOut)
async def stop_observer(observer_id: uuid.UUID, commands: CommandsDep) -> ObserverOut:
    """OnDeleting; a Scheduled observer becomes Deleted at once (nothing was started)."""
    return ObserverOut.of(await commands.stop(observer_id))


@router.patch("/{observer_id}", response_model=ObserverOut)
async def reschedule_observer(observer_id: uuid.UUID, body: Reschedule, commands: CommandsDep) -> ObserverOut:
    """Move a Scheduled observer's start_at (409 once it is no longer Scheduled)."""
    return ObserverOut.of(await commands.reschedule(observer_id, body.start_at))
