"""The balancer's statements: the fleet as it sees it, the observers it may hand over, and
the drain flags the API sets (``rounds.py`` runs them; the only SQL outside ``manager/db``, so
that the balancer has one home and ``manager/db`` imports nothing above it)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from manager.balance.plan import Member, Move
from manager.db.digests import held_per_service
from manager.db.models import Observer, ObserverHost, ObserverStatus, Service, ServiceStatus
from manager.db.service_observers import on_service
from manager.errors import Conflict, NotFound

# What a service's digest counts as held (migration 0008).
_HELD = (ObserverStatus.PROCESSING, ObserverStatus.ON_DELETING)


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
    by_pool = await _running_by_pool(session, [svc.id for svc, _ in rows if len(svc.pools) > 1])
    fleet = [
        Member(
            svc.id,
            svc.name,
            svc.workers_count,
            int(running),
            tuple(svc.pools),
            svc.draining,
            busy=svc.id in busy,
            kinds=frozenset(svc.kinds),
            process_kinds=frozenset(k["name"] for k in svc.kind_infos if k.get("isolation") == "process"),
            process_slots=svc.process_slots,
            by_pool=by_pool.get(svc.id, {}),
        )
        for svc, running in rows
    ]
    return fleet, {svc.id: svc.drain_note for svc, _ in rows}


async def _running_by_pool(session: AsyncSession, ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[str, int]]:
    """What each of these services (those in several pools) runs in each pool. Read through
    the services' index (``observer_hosts``), so it costs what they run, not the fleet; a
    service in one pool runs all it runs there, which its digest already counts."""
    if not ids:
        return {}
    query = (
        select(Observer.service_id, Observer.pool, func.count())
        .where(Observer.id.in_(select(ObserverHost.observer_id).where(ObserverHost.service_id.in_(ids))))
        .where(Observer.service_id.in_(ids), Observer.status.in_(_HELD), Observer.host_session_id.is_not(None))
        .group_by(Observer.service_id, Observer.pool)
    )
    found: dict[uuid.UUID, dict[str, int]] = {}
    for service_id, pool, count in (await session.execute(query)).all():
        if service_id is not None:
            found.setdefault(service_id, {})[pool] = int(count)
    return found


async def in_flight(session: AsyncSession, since: datetime) -> dict[str, int]:
    """Per pool, its observers published since ``since`` and not yet reported running
    (``Created``: a create, a restart after a death, a hand-over, a scheduled start fallen
    due), which no service's count holds yet. Read through the status index: outside a burst
    they are few. One older is not on its way but waiting (a kind no service runs, a queue
    holding it): it makes no service's count lag. Nor one the broker holds for an ended
    session (``awaiting_broker``): it is dealt to no one yet, and once the queue lets it go
    it should go where the placement points, to the service its node's death emptied."""
    query = (
        select(Observer.pool, func.count())
        .where(
            Observer.status == ObserverStatus.CREATED,
            Observer.modified_at > since,
            Observer.awaiting_broker_since.is_(None),
        )
        .group_by(Observer.pool)
    )
    return {pool: int(count) for pool, count in (await session.execute(query)).all()}


async def awaiting_broker(session: AsyncSession, since: datetime) -> set[str]:
    """The pools with an observer whose start the broker holds for an ended session, marked
    after ``since`` (``awaiting_broker_since``: a node died or was cut off while its service
    held it; few at once, read through their partial index, migration 0018)."""
    query = (
        select(Observer.pool)
        .where(
            Observer.awaiting_broker_since.is_not(None),
            Observer.awaiting_broker_since > since,
            Observer.status == ObserverStatus.CREATED,
            Observer.service_id.is_(None),
        )
        .distinct()
    )
    return set((await session.execute(query)).scalars())


async def movable(session: AsyncSession, move: Move) -> list[tuple[uuid.UUID, uuid.UUID | None]]:
    """Up to ``move.count`` observers of its pool running on its source that may be handed
    over, with the session holding each: to even the load, never a pinned one nor one on
    probation (it runs in a child process there); a drain takes every one. Either way only
    what one of the services that may take it can run (``move.to``): a kind one of them
    offers, and a child process only if one has process slots. Handed to services that cannot
    run it, a start would come back to its source, and move again every round."""
    kinds = set().union(*(m.kinds for m in move.to))
    process_kinds = set().union(*(m.process_kinds for m in move.to))
    query = select(Observer.id, Observer.host_session_id).where(
        on_service(move.source),
        Observer.status == ObserverStatus.PROCESSING,
        Observer.pool == move.pool,
        Observer.kind.in_(kinds),
    )
    if not any(m.process_slots > 0 for m in move.to):
        query = query.where(
            or_(Observer.isolation == "async", and_(Observer.isolation.is_(None), Observer.kind.not_in(process_kinds)))
        )
    if move.reason != "drain":
        query = query.where(Observer.pinned.is_(False), Observer.probation_since.is_(None))
    return list((await session.execute(query.limit(move.count))).all())


async def set_drain_notes(session: AsyncSession, notes: Mapping[uuid.UUID, str]) -> None:
    for service_id, note in notes.items():
        await session.execute(update(Service).where(Service.id == service_id).values(drain_note=note))


async def set_draining(session: AsyncSession, service_id: uuid.UUID, draining: bool) -> Service:
    """Drain an alive service, or let it take starts again."""
    service = await session.get(Service, service_id, with_for_update=True)
    if service is None:
        raise NotFound(f"no service with id {service_id}")
    if service.status != ServiceStatus.ALIVE:
        what = "drained" if draining else "uncordoned"
        raise Conflict(
            f"service {service.name} is {service.status.value}: only an alive service can be {what} "
            "(one started again under its name takes starts)"
        )
    service.draining = draining
    service.drain_note = "starting" if draining else None
    return service
