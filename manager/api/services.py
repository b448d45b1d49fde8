"""/api/services and /api/stats"""

from __future__ import annotations

import uuid

from fastapi import APIRouter

from manager.api.deps import SessionDep
from manager.api.schemas import ERRORS, ServiceOut, Stats
from manager.db import services

router = APIRouter(prefix="/api", tags=["services"], responses=ERRORS)


@router.get("/services", response_model=list[ServiceOut])
async def list_services(session: SessionDep) -> list[ServiceOut]:
    return [ServiceOut.of(svc, running) for svc, running in await services.list_services(session)]


@router.get("/services/{service_id}", response_model=ServiceOut)
async def get_service(service_id: uuid.UUID, session: SessionDep) -> ServiceOut:
    svc, running = await services.get_service(session, service_id)
    return ServiceOut.of(svc, running)


@router.get("/stats", response_model=Stats)
async def get_stats(session: SessionDep) -> Stats:
    return Stats.model_validate(await services.stats(session))
