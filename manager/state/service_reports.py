"""The rules of service reports: a service born, heartbeating, gone, and what it says it
runs (its digest, and the inventory a differing digest asks for). ``StateRules`` (``rules.py``)
dispatches each report here, inside its transaction and with its rows; the compare-and-set
rules these follow are in its docstring."""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from manager.balance.retire import QueueHeld
from manager.db import observers
from manager.db.digests import held_digest
from manager.db.models import EventType, Observer, ServiceStatus
from manager.db.service_observers import ids_on
from manager.db.sql import id_in
from manager.metrics import DIGEST_MISMATCHES, DIGESTS_COMPARED
from manager.state.context import STOPPING_OR_GONE, S, StateContext
from manager.state.follow_ups import FollowUps
from manager.state.probation import service_died
from manager.state.rows import Row
from shared.messages import (
    InventoryRequest,
    ServiceBorn,
    ServiceDigest,
    ServiceHeartbeat,
    ServiceInventory,
    SetStartQueues,
)

logger = logging.getLogger(__name__)


async def born(ctx: StateContext, session: AsyncSession, m: ServiceBorn, now: datetime, out: FollowUps) -> None:
    services = ctx.services_of(session)
    for old in await services.namesakes(m.name, m.service_id):
        await services.delete(old.id, now)
        logger.info("service %s (%s) restarted as %s: old instance deleted", m.name, old.id, m.service_id)
        if old.status == ServiceStatus.ALIVE:
            # It died without a word (a lost one was counted when judged lost).
            isolate = await service_died(ctx.rows_of(session), old.id, old.last_heartbeat_at, now, ctx.probation)
            for observer_id, current in isolate.items():
                out.isolate(observer_id, current)
        await release_observers(ctx, session, old.id, now)
    await services.born(m, now)
    if ctx.start_queues > 1:  # before the balancer's first placement, a round later
        out.messages.append(SetStartQueues(service_id=m.service_id, start_queues=ctx.start_queues))


async def heartbeat(
    ctx: StateContext, session: AsyncSession, m: ServiceHeartbeat, now: datetime, out: FollowUps
) -> None:
    services = ctx.services_of(session)
    placed = (m.priority, m.cordoned, tuple(sorted(m.pool_priorities.items())))
    ctx.placements[m.service_id] = (placed, m.start_queues)
    if m.queue_held or m.service_id in ctx.queue_held:
        ctx.queue_held[m.service_id] = QueueHeld(m.session_id, tuple(m.queue_held), time.monotonic())
    if not await services.touch(m.service_id, now, m.running, m.session_id, m.loop_lag_ms, m.refused):
        await ctx.introduce_if_unknown(session, m.service_id, out)


async def service_gone(ctx: StateContext, session: AsyncSession, service_id: uuid.UUID, now: datetime) -> None:
    await ctx.services_of(session).delete(service_id, now, running=0)
    await release_observers(ctx, session, service_id, now)


async def release_observers(ctx: StateContext, session: AsyncSession, service_id: uuid.UUID, now: datetime) -> None:
    """The service is gone: its observers wait, on no service, for a new start report."""
    rows_of = ctx.rows_of(session)
    for obs in await rows_of.held_by(service_id):
        obs.set_service(None)
        obs.modified_at = now
        if obs.status == S.PROCESSING:
            obs.status = S.CREATED
        rows_of.event(obs.id, EventType.RELEASED, now, from_service_id=service_id)


async def digest(ctx: StateContext, session: AsyncSession, m: ServiceDigest, now: datetime, out: FollowUps) -> None:
    """Compare a service's digest with the rows; ask for its whole inventory if they differ."""
    if not await ctx.services_of(session).touch(m.service_id, now, m.count, m.session_id):
        await ctx.introduce_if_unknown(session, m.service_id, out)
        return
    await ctx.rows_of(session).flush()  # the digest is read from the rows as changed so far
    count, digest = await held_digest(session, m.service_id, m.session_id)
    DIGESTS_COMPARED.inc()
    if (count, digest) != (m.count, m.digest):
        DIGEST_MISMATCHES.inc()
        logger.info(
            "service %s runs %d observer(s), the rows say %d (or other ones): asking for its inventory",
            m.service_id,
            m.count,
            count,
        )
        out.messages.append(InventoryRequest(service_id=m.service_id))


async def inventory(
    ctx: StateContext, session: AsyncSession, m: ServiceInventory, now: datetime, out: FollowUps
) -> None:
    """Reconcile what a service really runs. Only rows that disagree are loaded: in the
    steady state an inventory of 30,000 ids costs two index scans, no Python per id."""
    if not await ctx.services_of(session).touch(m.service_id, now, len(m.observer_ids), m.session_id):
        await ctx.introduce_if_unknown(session, m.service_id, out)
        return
    sid = m.service_id
    listed = set(m.observer_ids)
    if await observers.count_existing(session, listed) != len(listed):
        found = await observers.existing_ids(session, listed)
        for oid in listed - found:
            ctx.suspicions.unknown.setdefault(oid, (sid, time.monotonic()))
    running_here = (
        (Observer.status == S.PROCESSING)
        & (Observer.service_id == sid)  # judged on rows found by id: no lookup by service
        & Observer.host_session_id.is_not_distinct_from(m.session_id)
    )
    held = (S.PROCESSING, S.ON_DELETING)
    on_service = id_in(Observer.id, await ids_on(session, sid))  # an OR below: see ids_on
    held_here = on_service & (Observer.service_id == sid) & Observer.status.in_(held)
    conflicts = ctx.suspicions.conflicts

    def disagrees(row: Row) -> bool:  # the query's condition, for the rows cached in this batch
        if row.id in listed:
            here = row.status == S.PROCESSING and row.service_id == sid and row.host_session_id == m.session_id
            return not here or row.id in conflicts
        return (row.service_id == sid and row.status in held) or row.id in conflicts

    rows = await ctx.rows_of(session).matching(
        (id_in(Observer.id, listed) & ~running_here)
        | (held_here & ~id_in(Observer.id, listed))
        | id_in(Observer.id, conflicts),
        disagrees,
    )
    for obs in rows:
        if obs.id in listed or obs.service_id == sid:  # conflicts of other services wait for theirs
            await reconcile(ctx, session, obs, m, obs.id in listed, now, out)


SESSION_ENDED = (
    "its service's broker session ended (it speaks from a new one): its start is held for the ended session "
    "until the broker hands it on (on a cluster, once the queue lets that session go)"
)


async def reconcile(
    ctx: StateContext, session: AsyncSession, obs: Row, m: ServiceInventory, listed: bool, now: datetime, out: FollowUps
) -> None:
    sid = m.service_id
    conflicting = ctx.suspicions.conflicts.pop(obs.id, None) if obs.service_id == sid else None
    if not listed:
        if obs.status == S.PROCESSING:
            # Not running where we thought: another copy (conflicting) or nobody.
            ended = obs.host_session_id if obs.host_session_id not in (None, m.session_id) else None
            obs.set_service(*(conflicting or (None, None)))
            obs.status = S.PROCESSING if conflicting else S.CREATED
            obs.modified_at = now
            if ended is not None and not conflicting:
                # The history and the API say why it runs nowhere: its start is held for the ended session.
                obs.awaiting_broker_since = now
                ctx.rows_of(session).event(
                    obs.id, EventType.RELEASED, now, from_service_id=sid, detail=SESSION_ENDED, from_session_id=ended
                )
        return
    if conflicting is not None:
        out.stop(obs.id, conflicting[0], "duplicate: also running on its service", conflicting[1])
    if obs.status in STOPPING_OR_GONE:
        out.stop(obs.id, sid, f"observer is {obs.status.value}", m.session_id)
        return
    if obs.service_id in (None, sid) or not await ctx.service_in(session, obs.service_id, (ServiceStatus.ALIVE,)):
        if obs.status != S.PROCESSING or obs.service_id != sid or obs.host_session_id != m.session_id:
            obs.status, obs.modified_at = S.PROCESSING, now
            obs.set_service(sid, m.session_id)
        return
    # Listed here but on another live service: ask that service what it runs.
    ctx.suspicions.conflicts[obs.id] = (sid, m.session_id)
    out.messages.append(InventoryRequest(service_id=obs.service_id))
