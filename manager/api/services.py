"""/api/services and /api/stats"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, status

from manager.api.deps import CommandsDep, SessionDep
from manager.api.schemas import ERRORS, ServiceOut, Stats
from manager.balance import fleet as fleet_rows
from manager.balance.plan import imbalance
from manager.db import services

router = APIRouter(prefix="/api", tags=["services"], responses=ERRORS)


@router.get("/services", response_model=list[ServiceOut])
async def list_services(session: SessionDep) -> list[ServiceOut]:
    return [ServiceOut.of(svc, running) for svc, running in await services.list_services(session)]


@router.get("/services/{service_id}", response_model=ServiceOut)
async def get_service(service_id: uuid.UUID, session: SessionDep) -> ServiceOut:
    svc, running = await services.get_service(session, service_id)
    return ServiceOut.of(svc, running)


@router.post("/services/{service_id}/drain", status_code=status.HTTP_202_ACCEPTED, response_model=ServiceOut)
async def drain_service(service_id: uuid.UUID, commands: CommandsDep) -> ServiceOut:
    """Cordon the service (no new starts) and hand its observers to the others, a bounded
    number per second; ``drain_note`` says how it goes, and "drained" once none is left (it
    can then be stopped with nothing moving). 409 unless it is alive."""
    return ServiceOut.of(*await commands.set_draining(service_id, True))


@router.post("/services/{service_id}/uncordon", response_model=ServiceOut)
async def uncordon_service(service_id: uuid.UUID, commands: CommandsDep) -> ServiceOut:
    """End a drain: the service takes starts again (the balancer evens the load from there)."""
    return ServiceOut.of(*await commands.set_draining(service_id, False))


@router.get("/stats", response_model=Stats)
async def get_stats(session: SessionDep) -> Stats:
    fleet, _ = await fleet_rows.members(session, set())
    return Stats.model_validate(await services.stats(session) | {"imbalance": round(imbalance(fleet), 4)})
