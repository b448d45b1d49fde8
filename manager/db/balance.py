"""The statements of even load and drains: the fleet as the balancer sees it, the observers
it may hand over, and the drain flags the API sets (``manager/repairs/balance.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from manager.balance.plan import Member
from manager.db.digests import held_per_service
from manager.db.hosts import hosted_on
from manager.db.models import Observer, ObserverStatus, Service, ServiceStatus
from manager.errors import Conflict, NotFound


async def members(session: AsyncSession, busy: set[uuid.UUID]) -> tuple[list[Member], dict[uuid.UUID, str | None]]:
    """The alive services as the balancer sees them, and each one's drain note."""
    counts = held_per_service()
    rows = (
        await session.execute(
            select(Service, func.coalesce(counts.c.running, 0))
            .outerjoin(counts, counts.c.service_id == Service.id)
            .where(Service.status == ServiceStatus.ALIVE)
        )
    ).all()
    fleet = [
        Member(svc.id, svc.name, svc.workers_count, int(running), tuple(svc.pools), svc.draining, busy=svc.id in busy)
        for svc, running in rows
    ]
    return fleet, {svc.id: svc.drain_note for svc, _ in rows}


async def movable(
    session: AsyncSession, service_id: uuid.UUID, pool: str, count: int, *, drain: bool
) -> list[tuple[uuid.UUID, uuid.UUID | None]]:
    """Up to ``count`` observers of ``pool`` running on ``service_id`` that may be handed over,
    with the session holding each: to even the load, never a pinned one nor one on probation
    (it runs in a child process there); a drain takes every one."""
    query = select(Observer.id, Observer.host_session_id).where(
        hosted_on(service_id), Observer.status == ObserverStatus.PROCESSING, Observer.pool == pool
    )
    if not drain:
        query = query.where(Observer.pinned.is_(False), Observer.probation_since.is_(None))
    return list((await session.execute(query.limit(count))).tuples())


async def set_drain_notes(session: AsyncSession, notes: Mapping[uuid.UUID, str]) -> None:
    for service_id, note in notes.items():
        await session.execute(update(Service).where(Service.id == service_id).values(drain_note=note))


async def set_draining(session: AsyncSession, service_id: uuid.UUID, draining: bool) -> Service:
    """Drain an alive service, or let it take starts again."""
    service = await session.get(Service, service_id, with_for_update=True)
    if service is None:
        raise NotFound(f"no service with id {service_id}")
    if draining and service.status != ServiceStatus.ALIVE:
        raise Conflict(f"service {service.name} is {service.status.value}: only an alive service can be drained")
    service.draining = draining
    service.drain_note = "starting" if draining else None
    return service
