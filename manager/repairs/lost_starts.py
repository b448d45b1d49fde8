"""Rows waiting for a start that is in no queue get it published again (issue 11).

A Created observer without a service waits for its start message to be taken; an OnDeleting
one without a service waits for a service to take its start and stop it. If that start is
gone (acked by a stop aimed at the wrong copy before sessions named their copies, a queue
deleted by an operator, a bug), nothing would ever happen: the row stays Created, or is
re-stopped for ever. The queues cannot be searched for one message, but a pool whose start
queue holds no ready message has none waiting; so a row seen with no service in such a pool at
every pass for ``ORCH_LOST_START_AFTER_S`` gets its start published again. If the start
was in fact held by a service that had not reported it yet, or one that hands it back
every few seconds (its kind missing, its process slots full: the queue is then empty most
of the time), the duplicate is absorbed by the rules (a second start reported while the
first service lives is stopped); the wait doubles after each attempt for the same row (up to
64 times), so such a row does not pile up copies. A start a service declined within the wait
(it cannot run it, and handed it on: ``manager/state/declines.py``) is not lost: it is held
or on its way, and a second copy would run beside the first once a service could take both.

A Created row whose start the broker holds for an ended session (``awaiting_broker_since``:
a node died or was cut off while its service held it) is not lost either: the queue hands
the start on once it lets that session go, and a copy published meanwhile would run beside
it. Such a row waits ``BROKER_HOLDS_AT_MOST_S`` from its mark before it counts as waiting.

The memory of when each row was first seen is in this process only: a manager restart
starts the wait over, which only delays the repair.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.db import observers
from manager.db.models import ObserverStatus
from manager.repairs.base import Repair
from manager.start_messages import start_message
from manager.start_publisher import StartPublisher
from manager.state.declines import Declines
from shared.messages import DECLINED_HOLD_S
from shared.topology import BROKER_HOLDS_AT_MOST_S

logger = logging.getLogger(__name__)

_LIMIT = 10_000
_MAX_DOUBLINGS = 6
S = ObserverStatus


class LostStarts(Repair):
    name = "republish_lost"

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], starts: StartPublisher, declines: Declines, after_s: float
    ) -> None:
        self.sessions = sessions
        self.starts = starts
        self.broker = starts.broker
        self.declines = declines
        self.after_s = after_s
        self.period_s = after_s / 4
        self._seen: dict[uuid.UUID, float] = {}  # observer -> when first seen waiting in an empty pool
        self._attempts: dict[uuid.UUID, int] = {}  # observer -> starts published again so far

    async def run(self) -> None:
        """Publish again the starts of rows that waited too long."""
        now_at = datetime.now(UTC)
        unchanged = now_at - timedelta(seconds=self.after_s)
        held = now_at - timedelta(seconds=max(self.after_s, BROKER_HOLDS_AT_MOST_S))
        async with self.sessions() as session:
            rows = await observers.waiting_pools(session, unchanged, held, _LIMIT)
        if not rows:
            self._seen.clear()
            self._attempts.clear()
            return
        backlog = {pool: await self.broker.start_backlog(pool) for pool in {pool for _, pool in rows}}
        now = time.monotonic()
        # Declined since the last wait began, or since the service that holds it said so last.
        declined = self.declines.recently(self.after_s + 2 * DECLINED_HOLD_S)
        self._seen = {oid: self._seen.get(oid, now) for oid, pool in rows if backlog[pool] == 0 and oid not in declined}
        self._attempts = {oid: n for oid, n in self._attempts.items() if oid in self._seen}
        due = [
            oid
            for oid, seen in self._seen.items()
            if now - seen >= self.after_s * 2 ** min(self._attempts.get(oid, 0), _MAX_DOUBLINGS)
        ]
        if not due:
            return
        async with self.sessions() as session:
            lost = await observers.still_waiting(session, due, unchanged, held)
        await self.starts.publish([start_message(obs) for obs in lost])
        for obs in lost:
            self._seen[obs.id] = now  # a longer wait before the next attempt
            self._attempts[obs.id] = self._attempts.get(obs.id, 0) + 1
        if lost:
            logger.warning(
                "published again %d start(s) that were in no queue (e.g. %s, %s for %.0fs with no service)",
                len(lost),
                lost[0].id,
                lost[0].status.value,
                self.after_s,
            )
