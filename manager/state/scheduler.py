"""Scheduled starts and stops, fired by the leader's state side (docs/design.md, "Scheduled
start and stop").

Every ``POLL_S``, or at the next due time if that comes sooner (the first entry of either
index), or at once after a full batch, it asks the two partial indexes of migration 0016 for
due rows, ``BATCH`` at a time:

* due starts: Scheduled → Created with a pending start and a ``due`` event in one
  transaction, then the starts are published with confirms and the pending rows deleted:
  the create's own path. A crash after the commit leaves pending starts, which the
  pending-start repair publishes (``manager/repairs/pending_starts.py``); a crash before it
  leaves the rows Scheduled, and the next leader takes them. So a start is never lost, and
  never published twice except as a create's can be (a confirm lost with the manager),
  which the state rules absorb.
* due stops: Created/Processing → OnDeleting (the stop is broadcast as an API stop is; the
  re-stop repair sends it again if the broker is away), Scheduled → Deleted, each with an
  ``expired`` event.

Only the leader runs it (it is one of ``StateSide``'s tasks), so two managers never fire the
same row; and the rows are taken ``SKIP LOCKED`` in one statement with their change, so even
two schedulers would not. A manager down at the due time fires late, when it leads again.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db import schedule as schedule_rows
from manager.db.errors import database_outage, describe, is_transient
from manager.metrics import SCHEDULED_EXPIRED, SCHEDULED_STARTS
from manager.start_messages import start_message
from manager.start_publisher import StartPublisher
from shared.errors import BrokerUnavailable
from shared.messages import stop_messages

logger = logging.getLogger(__name__)

POLL_S = 0.2  # well under the second a start may be late
BATCH = 1000  # a bulk create's size: due rows start at the create rate


class Scheduler:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        broker: BrokerLink,
        starts: StartPublisher,
        poll_s: float = POLL_S,
        batch: int = BATCH,
    ) -> None:
        self.sessions = sessions
        self.broker = broker
        self.starts = starts
        self.poll_s = poll_s
        self.batch = batch
        self._database = database_outage("the scheduler", logger)

    async def run(self) -> None:
        """Until cancelled; the broker's or the database's failures are logged and waited out."""
        while True:
            wait_s = self.poll_s
            if self.broker.ready.is_set():
                try:
                    wait_s = 0.0 if await self.fire() else await self._until_next()
                    self._database.worked()
                except BrokerUnavailable as e:
                    logger.warning("scheduler: broker unavailable (%s); the pending-start repair takes over", e)
                except Exception as e:
                    if not is_transient(e):
                        # Like a failed repair: said, and tried again next pass, without taking
                        # the state consumer down with it.
                        logger.exception("scheduler pass failed")
                    else:
                        self._database.failed(describe(e))
            if wait_s > 0:
                await asyncio.sleep(wait_s)

    async def _until_next(self) -> float:
        """How long to sleep: until the next due time, at most ``poll_s`` (the API process
        adds rows this one is not told of)."""
        async with self.sessions() as session:
            due = await schedule_rows.next_due(session)
        if due is None:
            return self.poll_s
        return min(self.poll_s, max(0.0, (due - datetime.now(UTC)).total_seconds()))

    async def fire(self) -> bool:
        """One batch of due starts and one of due stops; True if either was full (more may be
        due). Stops are not held back by starts that fail (nor the reverse: the next pass)."""
        try:
            started = await self.start_due()
        finally:
            expired = await self.expire_due()
        return started >= self.batch or expired >= self.batch

    async def start_due(self) -> int:
        starts, broken = [], []
        async with self.sessions.begin() as session:
            now = datetime.now(UTC)
            for row in await schedule_rows.take_due(session, now, self.batch):
                try:
                    starts.append(start_message(row))
                except Exception as e:  # noqa: BLE001 - whatever is wrong, it is this row's alone
                    broken.append((row.id, f"its start could not be built at its start_at: {e}"))
            if broken:
                # Failed in the same transaction (its stored fields no longer validate: edited by
                # hand, written by another version), so it never holds back the others.
                await schedule_rows.set_aside(session, broken, now)
        for observer_id, reason in broken:
            logger.error("scheduled observer %s is Failed: %s; the other due starts go on", observer_id, reason)
        if not starts:
            return len(broken)
        await self.starts.publish_pending(starts)
        SCHEDULED_STARTS.inc(len(starts))
        logger.info("started %d scheduled observer(s)", len(starts))
        return len(starts) + len(broken)

    async def expire_due(self) -> int:
        async with self.sessions.begin() as session:
            stopping, deleted = await schedule_rows.expire_due(session, datetime.now(UTC), self.batch)
        if stopping:
            ids = [oid for oid, _ in stopping]
            for message in stop_messages(ids, "stop_at reached", lives=[life for _, life in stopping]):
                # If the broker refuses, the rows are OnDeleting: the re-stop repair sends it again.
                await self.broker.publish_control(message)
        n = len(stopping) + len(deleted)
        if n:
            SCHEDULED_EXPIRED.inc(n)
            logger.info("%d observer(s) reached their stop_at (%d never started)", n, len(deleted))
        return n
