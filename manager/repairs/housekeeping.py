"""Small repairs that keep the state side's own tables short or current: probations ended,
applied-message ids forgotten, history pruned, services long gone forgotten, the triggers'
deltas folded."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.db import applied, observers, services
from manager.db.counts import fold_deltas
from manager.db.digests import fold_digest_deltas
from manager.repairs.base import Repair
from manager.repairs.retention import BATCH as PRUNE_BATCH
from manager.repairs.retention import EVERY_S as PRUNE_EVERY_S
from manager.repairs.retention import prune_events
from manager.state.probation import end_probations
from manager.state.rows import ObserverRows

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
    to introduce itself, as any unknown service is."""

    name = "forget_services"

    def __init__(self, sessions: async_sessionmaker[AsyncSession], retention_s: float) -> None:
        self.sessions = sessions
        self.retention = timedelta(seconds=retention_s)
        self.period_s = min(60.0, retention_s / 4)

    async def run(self) -> None:
        async with self.sessions.begin() as session:
            forgotten = await services.forget_gone(session, datetime.now(UTC) - self.retention)
        if forgotten:
            logger.info("forgot %d service(s) gone for longer than ORCH_SERVICES_RETENTION_S", forgotten)


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
