"""The API process's sampler: every ``ORCH_HISTORY_SAMPLE_S`` one read-only statement
(``manager.db.history``) becomes one sample of the ring (``manager.history.ring``).

In the API process rather than the state side, so every manager (the leader and those
standing by) draws the same charts from the same database. A failed read (the database
down) is a gap, said as every loop says an outage (``shared.outage``): the next sample's
totals carry what happened meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.db.errors import DATABASE_ERRORS, database_outage, describe
from manager.db.history import SampleRead, read_sample
from manager.db.models import ObserverStatus
from manager.history.moves import MoveCounter
from manager.history.ring import History, Sample, ServiceLoad

logger = logging.getLogger(__name__)


class Sampler:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], period_s: float) -> None:
        self.sessions = sessions
        self.history = History(period_s, (s.value for s in ObserverStatus))
        self.moves = MoveCounter()

    def take(self, read: SampleRead, now: float) -> Sample:
        """A sample from a read (pure but for the move counter's state)."""
        statuses = tuple(read.statuses.get(status, 0) for status in self.history.statuses)
        failovers = self.moves.update(now, read.moved_above_lo, read.moved_above_next, read.max_id)
        return Sample(
            at=now,
            statuses=statuses,
            created=sum(statuses),
            stopped=read.statuses.get(ObserverStatus.DELETED.value, 0),
            failed=read.statuses.get(ObserverStatus.FAILED.value, 0),
            failovers=failovers,
            services=tuple(ServiceLoad(*service) for service in read.services),
        )

    async def sample_once(self) -> None:
        lo, next_lo = self.moves.floors()
        async with self.sessions() as session:
            read = await read_sample(session, lo, next_lo)
        self.history.add(self.take(read, time.time()))

    async def run(self) -> None:
        outage = database_outage("history", logger)
        while True:
            started = time.monotonic()
            try:
                await self.sample_once()
                outage.worked()
            except DATABASE_ERRORS as exc:
                # A gap in the charts until the database answers; the next totals carry it.
                outage.failed(describe(exc))
            await asyncio.sleep(max(0.0, self.history.period_s - (time.monotonic() - started)))
