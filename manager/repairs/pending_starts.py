"""Starts published again because the broker has none: left unconfirmed by a crash (the
pending-start repair), or gone with a deleted start queue (the gone-start repair).

A create commits its row and a ``pending_starts`` row together, publishes the start and
deletes the pending row once the broker confirmed it; a crash between commit and confirm
leaves it. The API process may be publishing a start right now that this (other) process
cannot see, so a pending start is left alone until it is ``ORCH_PENDING_START_AFTER_S`` old;
a start published twice anyway is absorbed by the rules.

A start queue deleted under a service took the starts it held, and a service moving starts
off a queue past ``ORCH_START_QUEUES`` acked them (``manager/balance/retire.py``): the
``starts_gone`` rule makes their rows Created and pending, and names them to the gone-start
repair, which publishes them at its next pass. Both run in the repair loop after the broker rebuild, never beside it: a
row the rebuild published is no longer pending, and is skipped.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.db import observers
from manager.repairs.base import Repair
from manager.start_messages import start_message
from manager.start_publisher import StartPublisher

logger = logging.getLogger(__name__)


class PendingStarts(Repair):
    name = "republish_pending"

    def __init__(self, sessions: async_sessionmaker[AsyncSession], starts: StartPublisher, after_s: float) -> None:
        self.sessions = sessions
        self.starts = starts
        self.after_s = after_s
        self.period_s = after_s / 4

    async def run(self) -> None:
        cutoff = datetime.now(UTC) - timedelta(seconds=self.after_s)
        async with self.sessions() as session:
            found = await observers.unconfirmed_starts(session, cutoff, 1000)
        rows = [obs for obs in found if obs.id not in self.starts.publishing]
        if not rows:
            return
        await self.starts.publish_pending([start_message(obs) for obs in rows])
        logger.warning("published again %d start(s) left unconfirmed by a crash", len(rows))


class GoneStarts(Repair):
    """Every pass: the starts ``gone`` names (the state rules add to it), still pending and
    with no service, published again; the names are forgotten once the broker confirmed them."""

    name = "republish_gone"

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], starts: StartPublisher, gone: set[uuid.UUID]
    ) -> None:
        self.sessions = sessions
        self.starts = starts
        self.gone = gone

    async def run(self) -> None:
        if not self.gone:
            return
        asked = list(self.gone)
        async with self.sessions() as session:
            rows = await observers.pending_without_service(session, asked)
        if rows:
            await self.starts.publish_pending([start_message(obs) for obs in rows])
            # A warning comes from the services when a queue is deleted; moves off a queue
            # past ORCH_START_QUEUES are the operator's wish, counted by the balancer.
            logger.info("published again %d start(s) the broker no longer held (StartsGone)", len(rows))
        self.gone.difference_update(asked)
