"""The rules of observer reports: an observer started (or moved), stopped, retrying, failed,
isolated, and the starts a service describes to be adopted. ``StateRules`` (``rules.py``)
dispatches each report here, inside its transaction and with its rows; the compare-and-set
rules these follow are in its docstring."""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from manager.db import observers
from manager.db.models import EventType, ServiceStatus
from manager.state.adoption import adopt
from manager.state.context import STOPPING_OR_GONE, S, StateContext
from manager.state.follow_ups import FollowUps
from manager.state.rows import Row
from shared.messages import (
    ObserverFailed,
    ObserverIsolated,
    ObserverRetrying,
    ObserversDescribed,
    ObserversHandedOver,
    ObserversStarted,
    ObserverStopped,
    StartsDeclined,
    StartsGone,
)

logger = logging.getLogger(__name__)


async def started_all(
    ctx: StateContext, session: AsyncSession, m: ObserversStarted, now: datetime, out: FollowUps
) -> None:
    for observer_id in m.observer_ids:
        await started(ctx, session, observer_id, m, now, out)


async def started(
    ctx: StateContext,
    session: AsyncSession,
    observer_id: uuid.UUID,
    m: ObserversStarted,
    now: datetime,
    out: FollowUps,
) -> None:
    """``observer_id`` started on ``m.service_id`` (in ``m.session_id``)."""
    obs = await _observer(ctx, session, observer_id)
    if obs is None:
        ctx.suspicions.unknown.setdefault(observer_id, (m.service_id, time.monotonic()))
        return
    if not await ctx.service_in(session, m.service_id, (ServiceStatus.ALIVE, ServiceStatus.LOST)):
        logger.info("ignoring start of %s reported by dead or unknown service %s", observer_id, m.service_id)
        await ctx.introduce_if_unknown(session, m.service_id, out)
        return
    if obs.status in STOPPING_OR_GONE:
        out.stop(obs.id, m.service_id, f"observer is {obs.status.value}", m.session_id)
        if obs.status == S.ON_DELETING:
            obs.set_service(m.service_id, m.session_id)
        return
    current = obs.service_id
    handover = ctx.handovers.landed(obs.id) if m.redelivered else None
    if handover is not None and handover.source != m.service_id and current in (None, handover.source):
        # The balancer had its service hand it over (the broker redelivered its start): the old
        # service ended it before giving it back, so it needs no stop.
        ctx.rows_of(session).event(
            obs.id,
            EventType.REBALANCED,
            now,
            service_id=m.service_id,
            from_service_id=handover.source,
            detail=f"{handover.reason}; started here {time.monotonic() - handover.at:.3f} s after it was asked",
        )
    elif not await _record_start(ctx, session, obs, m, now, out):
        return
    obs.status = S.PROCESSING
    obs.set_service(m.service_id, m.session_id)
    # A life's first start is its first attempt. A start elsewhere after its service died or
    # left carries on that attempt: a move is not the observer's failure (those come as
    # ObserverRetrying), and it leaves the indexed column as it was (migration 0011).
    obs.attempts = max(obs.attempts, 1)
    obs.modified_at = now
    if obs.probation_since is not None:
        if m.isolation == "process":
            obs.probation_clean_since = now
        else:  # a failover: the start message still says async
            obs.probation_clean_since = None
            out.isolate(obs.id, m.service_id)


async def _record_start(
    ctx: StateContext, session: AsyncSession, obs: Row, m: ObserversStarted, now: datetime, out: FollowUps
) -> bool:
    """Record a start as a first start or a move from its old service (stopped there if that
    service lives); False for a second copy, which is stopped instead."""
    old = obs.service_id
    if old is not None and old != m.service_id and await ctx.service_in(session, old, (ServiceStatus.ALIVE,)):
        if m.redelivered:
            # Only the copy we knew of: the old service may hold a newer one by now.
            out.stop(obs.id, old, "moved to another service", obs.host_session_id)
        else:
            out.stop(obs.id, m.service_id, "duplicate start message", m.session_id)
            return False
    if old is not None and old != m.service_id:
        ctx.rows_of(session).event(
            obs.id,
            EventType.MOVED,
            now,
            service_id=m.service_id,
            from_service_id=old,
            from_session_id=obs.host_session_id,
        )
        ctx.moved_from_at[old] = time.monotonic()
    else:
        ctx.rows_of(session).event(obs.id, EventType.STARTED, now, service_id=m.service_id)
    return True


async def handed_over(ctx: StateContext, session: AsyncSession, m: ObserversHandedOver, now: datetime) -> None:
    """Their service ended them and gave their starts back to the queue: they wait, on no service,
    for the start report of the service the broker gives each to (which records the move).
    A row that already names another service, or a newer copy, is past this."""
    rows = ctx.rows_of(session)
    for observer_id in m.observer_ids:
        obs = await _observer(ctx, session, observer_id)
        if obs is None or obs.service_id != m.service_id or obs.host_session_id not in (None, m.session_id):
            continue
        obs.set_service(None)
        obs.modified_at = now
        if obs.status == S.PROCESSING:
            obs.status = S.CREATED
        if ctx.handovers.of(obs.id) is None:  # not the balancer's: no start will say rebalanced
            rows.event(obs.id, EventType.RELEASED, now, from_service_id=m.service_id, detail=m.reason)


async def starts_gone(ctx: StateContext, session: AsyncSession, m: StartsGone, now: datetime, out: FollowUps) -> None:
    """A start queue was deleted while ``m.service_id`` held these starts from it in
    ``m.session_id``, or that service acked them off a queue past ``ORCH_START_QUEUES``
    (``m.retired``): the broker holds no copy, and that service stopped the observers before
    it said so. No copy is left anywhere: a live one waits on no service, pending, and the
    gone-start repair publishes its start again (``manager/repairs/pending_starts.py``); a
    stop under way is done.

    Only a row this service holds in that session is taken. Any other has a start of its own:
    another service's or a newer session's, or, on no service, one the broker holds or the rebuild
    published (it releases every row when the broker lost its data, the deleted start
    queues with it, and publishes them all; a second copy would run on two services)."""
    rows = ctx.rows_of(session)
    again = []
    for observer_id in m.observer_ids:
        obs = await _observer(ctx, session, observer_id)
        if obs is None or obs.status not in (S.CREATED, S.PROCESSING, S.ON_DELETING):
            continue
        if obs.service_id != m.service_id or obs.host_session_id not in (None, m.session_id):
            continue
        obs.set_service(None)
        obs.modified_at = now
        if obs.status == S.ON_DELETING:
            obs.status = S.DELETED
            detail = "its start queue was deleted while it was being stopped"
            rows.event(obs.id, EventType.STOPPED, now, service_id=m.service_id, detail=detail)
            continue
        obs.status = S.CREATED
        if m.retired:
            detail = f"moved off a start queue of pool {', '.join(m.pools)} past ORCH_START_QUEUES: published again"
        else:
            detail = f"its start went with the deleted start queue of pool {', '.join(m.pools)}: published again"
        rows.event(obs.id, EventType.RELEASED, now, from_service_id=m.service_id, detail=detail)
        again.append(obs.id)
    if again:
        await observers.mark_pending(session, again, now)
        out.gone_starts += again


def declined(ctx: StateContext, session: AsyncSession, m: StartsDeclined, now: datetime) -> None:
    """A service cannot run these starts and handed them on (``manager/state/declines.py``):
    noted, so that no second copy is published, and said in each one's history."""
    rows = ctx.rows_of(session)
    for observer_id in m.observer_ids:
        if ctx.declines.heard(observer_id, m.service_id, m.reason):
            rows.event(observer_id, EventType.DECLINED, now, service_id=m.service_id, detail=m.reason)


async def stopped(ctx: StateContext, session: AsyncSession, m: ObserverStopped, now: datetime) -> None:
    # Any service may end a requested stop, not only the service we know of: the sender
    # acked a copy of the start (maybe one the broker redelivered to it before we
    # heard of the move). A copy left elsewhere is stopped by the rules for Deleted
    # (its start report or its service's inventory gets a targeted stop).
    obs = await _observer(ctx, session, m.observer_id)
    if obs is not None and obs.status == S.ON_DELETING:
        obs.status, obs.modified_at = S.DELETED, now
        obs.set_service(await _known_or_none(ctx, session, m.service_id))
        ctx.rows_of(session).event(obs.id, EventType.STOPPED, now, service_id=m.service_id, detail=m.reason)


async def retrying(ctx: StateContext, session: AsyncSession, m: ObserverRetrying, now: datetime) -> None:
    obs = await _observer(ctx, session, m.observer_id)
    if obs is None or obs.status != S.PROCESSING or not await _speaks_for(ctx, session, obs, m.service_id):
        return
    obs.attempts += 1
    obs.last_error, obs.modified_at = m.error, now
    if obs.probation_clean_since is not None:
        obs.probation_clean_since = now  # its child failed: the clean run starts over
    detail = f"attempt {m.attempt} in {m.delay_s:g}s after: {m.error}"
    ctx.rows_of(session).event(obs.id, EventType.RETRYING, now, service_id=m.service_id, detail=detail)


async def failed(ctx: StateContext, session: AsyncSession, m: ObserverFailed, now: datetime) -> None:
    obs = await _observer(ctx, session, m.observer_id)
    if obs is None or obs.status in (S.DELETED, S.FAILED) or not await _speaks_for(ctx, session, obs, m.service_id):
        return
    obs.status = S.DELETED if obs.status == S.ON_DELETING else S.FAILED
    obs.last_error = m.reason
    obs.set_service(await _known_or_none(ctx, session, m.service_id))
    obs.modified_at = now
    event = EventType.FAILED if obs.status == S.FAILED else EventType.STOPPED
    ctx.rows_of(session).event(obs.id, event, now, service_id=m.service_id, detail=m.reason)


async def isolated(ctx: StateContext, session: AsyncSession, m: ObserverIsolated, now: datetime) -> None:
    """Its service runs it in a child process now: the clean run of its probation begins."""
    obs = await _observer(ctx, session, m.observer_id)
    if obs is None or obs.status != S.PROCESSING or obs.service_id != m.service_id or obs.probation_since is None:
        return
    obs.probation_clean_since = now
    ctx.rows_of(session).event(obs.id, EventType.ISOLATED, now, service_id=m.service_id)


async def described(
    ctx: StateContext, session: AsyncSession, m: ObserversDescribed, now: datetime, out: FollowUps
) -> None:
    if not await ctx.service_in(session, m.service_id, (ServiceStatus.ALIVE, ServiceStatus.LOST)):
        await ctx.introduce_if_unknown(session, m.service_id, out)
        return
    for start in m.starts:
        ctx.suspicions.unknown.pop(start.observer_id, None)
    await adopt(session, ctx.rows_of(session), m, now, out)


async def _speaks_for(ctx: StateContext, session: AsyncSession, obs: Row, service_id: uuid.UUID) -> bool:
    """A report about an observer counts if it comes from its service, or if it has no
    live service (the broker gave its start to the sender when the old service died)."""
    if obs.service_id in (None, service_id):
        return True
    return not await ctx.service_in(session, obs.service_id, (ServiceStatus.ALIVE,))


async def _known_or_none(ctx: StateContext, session: AsyncSession, service_id: uuid.UUID) -> uuid.UUID | None:
    """The id, if it may be written as an observer's service: only a known service (no foreign
    key checks it since migration 0010; this does)."""
    return service_id if await ctx.services_of(session).get(service_id) is not None else None


async def _observer(ctx: StateContext, session: AsyncSession, observer_id: uuid.UUID) -> Row | None:
    """The observer's row, locked for the rest of the transaction."""
    return await ctx.rows_of(session).get(observer_id)
