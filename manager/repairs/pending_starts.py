"""Starts a crash left unconfirmed are published again (the pending-start repair).

A create commits its row and a ``pending_starts`` row together, publishes the start and
deletes the pending row once the broker confirmed it; a crash between commit and confirm
leaves it. The API process may be publishing a start right now that this (other) process
cannot see, so a pending start is left alone until it is ``ORCH_PENDING_START_AFTER_S`` old;
a start published twice anyway is absorbed by the rules."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db import observers
from manager.repairs.base import Repair
from manager.starts import start_message

logger = logging.getLogger(__name__)


class PendingStarts(Repair):
    name = "republish_pending"

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        broker: BrokerLink,
        after_s: float,
        in_flight: set[uuid.UUID],
    ) -> None:
        self.sessions = sessions
        self.broker = broker
        self.after_s = after_s
        self.period_s = after_s / 4
        self.in_flight = in_flight  # starts this process is publishing (one-process mode)

    async def run(self) -> None:
        cutoff = datetime.now(UTC) - timedelta(seconds=self.after_s)
        async with self.sessions() as session:
            found = await observers.unconfirmed_starts(session, cutoff, 1000)
        rows = [obs for obs in found if obs.id not in self.in_flight]
        if not rows:
            return
        await self.broker.publish_starts([start_message(obs) for obs in rows])
        async with self.sessions.begin() as session:
            await observers.mark_published(session, [o.id for o in rows])
        logger.warning("published again %d start(s) left unconfirmed by a crash", len(rows))
