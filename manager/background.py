"""Periodic repairs, a pass per ``sweep_interval_s``; a step whose own threshold is longer
runs at a quarter of that threshold (``BackgroundLoops._periods``), since checking a 60-s
condition every second only costs: seven transactions a second kept the manager's state
process at about 1.3 CPU s a minute while idle, at any size (``make bench-scale``). The steps:

* re-broadcast stops still OnDeleting after ``restop_after_s`` (seed scenario 5: the stop
  may have hit no service while the observer was being redistributed);
* ask the broker about services whose heartbeats are ``lost_after_heartbeats`` periods late,
  and mark lost those whose connection is gone (``manager/liveness.py``) — only while the
  state backlog is drained (after a manager restart, or a burst of reports), so a heartbeat
  still waiting in the queue is not judged as silence;
* publish again the starts a crash left unconfirmed (``pending_starts``);
* adopt observers reported running that have no row, after ``unknown_grace_s``;
* fold the deltas the triggers appended into the observer counts (``db/counts``) and the
  held digests (``state/digest``), every ``_FOLD_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db.counts import fold_deltas
from manager.db.errors import OutageLog, is_transient
from manager.db.models import (
    AbandonedObserver,
    AppliedStateMessage,
    Observer,
    ObserverStatus,
    PendingStart,
)
from manager.db.sql import id_in
from manager.liveness import Liveness
from manager.lost_starts import LostStarts
from manager.metrics import STOP_RESENDS
from manager.rebuild import rebuild
from manager.retention import BATCH as PRUNE_BATCH
from manager.retention import EVERY_S as PRUNE_EVERY_S
from manager.retention import prune_events
from manager.starts import start_message
from manager.state.digest import fold_digest_deltas
from manager.state.probation import end_probations
from manager.state.rows import ObserverRows
from manager.state.rules import StateRules
from shared.errors import BrokerUnavailable
from shared.messages import STOPS_PER_MESSAGE, DescribeRequest, InventoryRequest, IsolateObservers, stop_messages
from shared.settings import ManagerSettings

logger = logging.getLogger(__name__)

# How long the ids of applied state messages are kept to skip a redelivered batch.
APPLIED_RETENTION = timedelta(hours=1)
# How long observers whose create was answered 503 are stopped, not adopted, if found running.
ABANDONED_RETENTION = timedelta(days=1)
# Seconds between probation checks (a probation lasts a retry policy's reset_after_s, 60 s by
# default) and between deletions of old applied-message ids (kept an hour).
_PROBATION_CHECK_S = 5.0
_FORGET_APPLIED_S = 60.0
# Seconds between folds of the triggers' deltas. Every reader sums the deltas not folded yet
# (``db/counts``, ``state/digest``), so the fold only bounds how many rows they add up: a few
# per writing statement, a few hundred in 5 s of bulk creates. Folding every pass (1 s) was
# a transaction a second that, idle, found nothing to fold.
_FOLD_S = 5.0


class StepSchedule:
    """When each step is due: steps without a period every pass, the others ``period``
    seconds after they last succeeded."""

    def __init__(self, periods: dict[str, float]) -> None:
        self.periods = periods
        self._next: dict[str, float] = {}

    def due(self, step: str, now: float) -> bool:
        return now >= self._next.get(step, 0.0)

    def ran(self, step: str, now: float) -> None:
        self._next[step] = now + self.periods.get(step, 0.0)


class BackgroundLoops:
    def __init__(
        self,
        settings: ManagerSettings,
        sessions: async_sessionmaker[AsyncSession],
        broker: BrokerLink,
        rules: StateRules,
        in_flight: set[uuid.UUID],
        consumer_idle: Callable[[], bool],
    ) -> None:
        self.settings = settings
        self.in_flight = in_flight
        self.consumer_idle = consumer_idle
        self.sessions = sessions
        self.broker = broker
        self.rules = rules
        self.backlog_drained = False
        self._marker_checked = 0  # broker.connects when the rebuild marker was last checked
        self.lost_starts = LostStarts(sessions, broker, settings.lost_start_after_s)
        self.liveness = Liveness(settings, sessions, broker, rules.probation, self._isolate, rules.moved_from_at)
        self._next_prune = 0.0  # monotonic time of the next history pruning
        self._database = OutageLog("background repairs", logger)

    def _periods(self) -> dict[str, float]:
        """Seconds between runs of the steps that need not run every pass."""
        settings = self.settings
        return {
            # A death is judged at most a quarter of the silence late; nothing waits for it
            # (the broker hands a dead host's starts to the others as its connection drops).
            "judge_heartbeats": settings.silence_s / 4,
            "restop": settings.restop_after_s / 4,
            "republish_unenqueued": settings.enqueue_sweep_after_s / 4,
            "republish_lost": settings.lost_start_after_s / 4,
            "end_probations": _PROBATION_CHECK_S,
            "forget_applied": _FORGET_APPLIED_S,
            "fold_counts": _FOLD_S,
        }

    async def run(self) -> None:
        schedule = StepSchedule(self._periods())
        while True:
            # A reconnection ends the wait: the rebuild after a broker lost its data starts
            # then, not at the next pass (up to a sweep interval later).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.broker.reconnected.wait(), self.settings.sweep_interval_s)
            self.broker.reconnected.clear()
            if not self.broker.ready.is_set():
                continue
            for step in (
                self.rebuild_broker,
                self.restop,
                self.judge_heartbeats,
                self.republish_unenqueued,
                self.republish_lost,
                self.describe_unknown,
                self.end_probations,
                self.forget_applied,
                self.prune_history,
                self.fold_counts,
            ):
                if not schedule.due(step.__name__, time.monotonic()):
                    continue
                try:
                    await step()
                    schedule.ran(step.__name__, time.monotonic())  # a failed step runs next pass
                except BrokerUnavailable as e:
                    logger.warning("%s: broker unavailable (%s)", step.__name__, e)
                    break
                except Exception as e:
                    if not is_transient(e):
                        logger.exception("background step %s failed", step.__name__)
                        continue
                    # Unreachable or a lost race: the other steps need the database too, so
                    # wait for the next pass; a line when it begins, not a traceback per step.
                    self._database.failed(e)
                    break
            else:
                # A whole pass without a database failure: the step that failed last pass
                # (due again at once) succeeded in this one.
                self._database.worked()

    async def rebuild_broker(self) -> None:
        """After each (re)connection: a broker without the marker lost its data; publish
        every start again from the database (``manager/rebuild.py``)."""
        connects = self.broker.connects
        if connects == self._marker_checked:
            return
        if not await self.broker.probes.marker_present():
            await rebuild(self.sessions, self.broker)
            await self.broker.probes.declare_marker()
        self._marker_checked = connects

    async def restop(self) -> None:
        now = datetime.now(UTC)
        async with self.sessions.begin() as session:
            # Rows the state consumer holds are skipped (next pass), never waited for: waiting
            # in another lock order than the consumer's deadlocked the two over and over.
            rows = (
                await session.execute(
                    select(Observer.id, Observer.life)
                    .where(
                        Observer.status == ObserverStatus.ON_DELETING,
                        Observer.modified_at < now - timedelta(seconds=self.settings.restop_after_s),
                    )
                    .order_by(Observer.id)
                    .limit(10_000)
                    .with_for_update(skip_locked=True, key_share=True)
                )
            ).all()
            ids = [i for i, _ in rows]
            if ids:
                await session.execute(update(Observer).where(id_in(Observer.id, ids)).values(modified_at=now))
        for message in stop_messages(ids, "stop requested (again)", lives=[life for _, life in rows]):
            await self.broker.publish_control(message)
        if ids:
            STOP_RESENDS.inc(len(ids))
            logger.info("re-broadcast %d stop(s) still OnDeleting", len(ids))

    async def judge_heartbeats(self) -> None:
        # Silence is judged only while the manager is caught up: a heartbeat waiting in the
        # state queue (after a manager restart, or behind a burst of reports) is no silence,
        # and a ServiceStopped waiting there is no death.
        backlog = await self.broker.state_backlog()
        if backlog is None or backlog > 0 or not self.consumer_idle():
            if not self.backlog_drained:
                logger.info("state backlog: %s message(s) to apply before judging heartbeats", backlog)
            return
        if not self.backlog_drained:
            self.backlog_drained = True
            logger.info("state backlog drained: judging heartbeats from now on")
        await self.liveness.judge()

    async def _isolate(self, isolate: dict[uuid.UUID, uuid.UUID]) -> None:
        per_host: dict[uuid.UUID, list[uuid.UUID]] = {}
        for observer_id, host in isolate.items():
            per_host.setdefault(host, []).append(observer_id)
        for host, ids in per_host.items():
            logger.warning("%d observer(s) on probation: asking service %s to isolate them", len(ids), host)
            await self.broker.publish_control(IsolateObservers(observer_ids=ids, service_id=host))

    async def forget_applied(self) -> None:
        """Forget the ids of state messages applied long ago (a redelivery comes within
        seconds). Not while a backlog is being applied: after a long outage of the manager,
        its last unacked batch comes back only then."""
        if not self.backlog_drained:
            return
        cutoff = datetime.now(UTC) - APPLIED_RETENTION
        async with self.sessions.begin() as session:
            oldest = select(AppliedStateMessage.message_id).where(AppliedStateMessage.applied_at < cutoff).limit(10_000)
            await session.execute(delete(AppliedStateMessage).where(AppliedStateMessage.message_id.in_(oldest)))
            # A create answered 503 leaves its starts for minutes at most (a confirm late).
            abandoned = AbandonedObserver.at < datetime.now(UTC) - ABANDONED_RETENTION
            await session.execute(delete(AbandonedObserver).where(abandoned))

    async def prune_history(self) -> None:
        """Delete history older than ``ORCH_EVENTS_RETENTION_DAYS``: a batch a minute, or
        batch after batch while there is a backlog (``manager/retention.py``)."""
        if time.monotonic() < self._next_prune:
            return
        full = await prune_events(self.sessions, self.settings.events_retention_days) >= PRUNE_BATCH
        self._next_prune = time.monotonic() + (0 if full else PRUNE_EVERY_S)

    async def end_probations(self) -> None:
        async with self.sessions.begin() as session:
            rows = ObserverRows(session)
            ended = await end_probations(rows, datetime.now(UTC))
            await rows.flush()
        if ended:
            logger.info("%d observer(s) left probation after running cleanly in a child process", len(ended))

    async def republish_unenqueued(self) -> None:
        cutoff = datetime.now(UTC) - timedelta(seconds=self.settings.enqueue_sweep_after_s)
        async with self.sessions() as session:
            rows = [
                obs
                for obs in await session.scalars(
                    select(Observer)
                    .join(PendingStart, PendingStart.observer_id == Observer.id)
                    .where(PendingStart.created_at < cutoff)
                    .limit(1000)
                )
                if obs.id not in self.in_flight
            ]
        if not rows:
            return
        await self.broker.publish_starts([start_message(obs) for obs in rows])
        async with self.sessions.begin() as session:
            await session.execute(delete(PendingStart).where(PendingStart.observer_id.in_([o.id for o in rows])))
        logger.warning("published again %d start(s) left unconfirmed by a crash", len(rows))

    async def republish_lost(self) -> None:
        await self.lost_starts.sweep()

    async def fold_counts(self) -> None:
        async with self.sessions.begin() as session:
            await fold_deltas(session)
            await fold_digest_deltas(session)

    async def describe_unknown(self) -> None:
        """Observers reported running that have no row, after ``unknown_grace_s`` (a create's
        commit may be in flight): their host is asked for their starts, to adopt them
        (``manager/state/adoption.py``)."""
        unknown = self.rules.suspicions.unknown
        due = [
            (oid, sid)
            for oid, (sid, seen) in list(unknown.items())
            if time.monotonic() - seen >= self.settings.unknown_grace_s
        ]
        if not due:
            return
        async with self.sessions() as session:
            known = set(await session.scalars(select(Observer.id).where(id_in(Observer.id, [oid for oid, _ in due]))))
        orphans: dict[uuid.UUID, list[uuid.UUID]] = {}  # host -> observers with no row
        recheck: set[uuid.UUID] = set()
        for oid, sid in due:
            del unknown[oid]
            if oid in known:
                recheck.add(sid)  # its row committed after the report: ask the host to report again
            else:
                orphans.setdefault(sid, []).append(oid)
        for sid in recheck:
            await self.broker.publish_control(InventoryRequest(service_id=sid))
        # Batched per host: a database restored from an older backup leaves thousands at once.
        for sid, oids in orphans.items():
            logger.warning(
                "%d observer(s) run on %s but have no row (e.g. %s): asking it to describe them, to adopt them",
                len(oids),
                sid,
                oids[0],
            )
            for i in range(0, len(oids), STOPS_PER_MESSAGE):
                await self.broker.publish_control(
                    DescribeRequest(service_id=sid, observer_ids=oids[i : i + STOPS_PER_MESSAGE])
                )
