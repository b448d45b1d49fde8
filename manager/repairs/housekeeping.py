"""Small repairs that keep the state side's own tables short or current: probations ended,
applied-message ids forgotten, history pruned, services long gone forgotten, the triggers'
deltas folded."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db import applied, observers, services
from manager.db.counts import fold_deltas
from manager.db.digests import fold_digest_deltas
from manager.repairs.base import Repair
from manager.repairs.retention import BATCH as PRUNE_BATCH
from manager.repairs.retention import EVERY_S as PRUNE_EVERY_S
from manager.repairs.retention import prune_events
from manager.state.probation import end_probations
from manager.state.rows import ObserverRows
from shared import topology

logger = logging.getLogger(__name__)

# How long the ids of applied state messages are kept to skip a redelivered batch.
APPLIED_RETENTION = timedelta(hours=1)
# How long observers whose create was answered 503 are stopped, not adopted, if found running.
ABANDONED_RETENTION = timedelta(days=1)


class EndProbations(Repair):
    """Observers that ran cleanly in a child process for their ``reset_after_s`` leave
    probation (``manager/state/probation.py``). A probation lasts 60 s by default."""

    name = "end_probations"
    period_s = 5.0

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def run(self) -> None:
        async with self.sessions.begin() as session:
            rows = ObserverRows(session)
            ended = await end_probations(rows, datetime.now(UTC))
            await rows.flush()
        if ended:
            logger.info("%d observer(s) left probation after running cleanly in a child process", len(ended))


class ForgetApplied(Repair):
    """Forget the ids of state messages applied long ago (a redelivery comes within
    seconds). Not while a backlog is being applied: after a long outage of the manager, its
    last unacked batch comes back only then."""

    name = "forget_applied"
    period_s = 60.0

    def __init__(self, sessions: async_sessionmaker[AsyncSession], backlog_drained: Callable[[], bool]) -> None:
        self.sessions = sessions
        self.backlog_drained = backlog_drained

    async def run(self) -> None:
        if not self.backlog_drained():
            return
        now = datetime.now(UTC)
        async with self.sessions.begin() as session:
            await applied.forget_applied(session, now - APPLIED_RETENTION)
            # A create answered 503 leaves its starts for minutes at most (a confirm late).
            await observers.forget_abandoned(session, now - ABANDONED_RETENTION)


class PruneHistory(Repair):
    """Delete history older than ``ORCH_EVENTS_RETENTION_DAYS``: a batch a minute, or batch
    after batch while there is a backlog (``manager/repairs/retention.py``)."""

    name = "prune_history"

    def __init__(self, sessions: async_sessionmaker[AsyncSession], retention_days: float) -> None:
        self.sessions = sessions
        self.retention_days = retention_days
        self._next = 0.0  # monotonic time of the next batch

    async def run(self) -> None:
        if time.monotonic() < self._next:
            return
        full = await prune_events(self.sessions, self.retention_days) >= PRUNE_BATCH
        self._next = time.monotonic() + (0 if full else PRUNE_EVERY_S)


class ForgetServices(Repair):
    """Forget services gone (stopped, replaced, lost) longer than ``ORCH_SERVICES_RETENTION_S``:
    on Kubernetes each pod is a service named after the pod, so every restart leaves one more
    row, which ``GET /api/services`` would list for ever. A lost one that speaks again is asked
    to introduce itself, as any unknown service is.

    First the queue markers of each one's last broker session are deleted
    (``observer_service/queue_watch.py``): a service killed leaves them, an empty exchange
    bound to each start queue it held. Only sessions of services gone this long are named,
    never a live one's: a marker deleted under a live session would tell it its queue went.
    A row is forgotten only once its markers are deleted (no broker: the next pass)."""

    name = "forget_services"

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], broker: BrokerLink, start_queues: int, retention_s: float
    ) -> None:
        self.sessions = sessions
        self.broker = broker
        self.start_queues = start_queues
        self.retention = timedelta(seconds=retention_s)
        self.period_s = min(60.0, retention_s / 4)

    async def run(self) -> None:
        before = datetime.now(UTC) - self.retention
        async with self.sessions.begin() as session:
            gone = await services.gone_sessions(session, before)
        if gone:
            await self._delete_markers(gone)
        async with self.sessions.begin() as session:
            forgotten = await services.forget_gone(session, before)
        if forgotten:
            logger.info("forgot %d service(s) gone for longer than ORCH_SERVICES_RETENTION_S", forgotten)

    async def _delete_markers(self, gone: list[tuple[uuid.UUID, list[str]]]) -> None:
        probes = self.broker.probes
        queues = {}
        for pool in sorted({pool for _, pools in gone for pool in pools}):
            queues[pool] = topology.start_queue_names(pool, await probes.start_queues_in_use(pool, self.start_queues))
        names = [topology.marker_name(sid.hex, q) for sid, pools in gone for pool in pools for q in queues[pool]]
        await probes.delete_exchanges(names)


class FoldDeltas(Repair):
    """Fold the deltas the triggers appended into the observer counts (``db/counts``) and the
    held digests (``db/digests``). Every reader sums the deltas not folded yet, so the fold
    only bounds how many rows they add up: a few per writing statement, a few hundred in 5 s
    of bulk creates."""

    name = "fold_counts"
    period_s = 5.0

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def run(self) -> None:
        async with self.sessions.begin() as session:
            await fold_deltas(session)
            await fold_digest_deltas(session)
