"""Publishing starts: the one place a start is marked in flight, published and, once the
broker confirmed it, ends its pending row (``pending_starts``, invariant 6).

Every start the manager publishes goes through one ``StartPublisher`` per process: a create
and a restart (the API), the scheduler, the pending-start, gone-start and lost-start repairs,
the rebuild. While a start is in flight, this process's pending-start repair leaves its row
alone however slow the broker's confirms are (``publishing``); a start published by another
process (the API's, seen from the state process) is covered by the repair's age threshold.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db import observers
from shared.messages import StartObserver


class StartPublisher:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], broker: BrokerLink) -> None:
        self.sessions = sessions
        self.broker = broker
        self.publishing: set[uuid.UUID] = set()  # ids being published by this process now

    async def publish(self, starts: Sequence[StartObserver], *, rebuilding: bool = False) -> None:
        """Publish and wait for the broker's confirms (``BrokerLink.publish_starts``), the ids
        in flight meanwhile. Raises ``BrokerUnavailable``; the pending rows stay as they were."""
        ids = [start.observer_id for start in starts]
        self.publishing.update(ids)
        try:
            await self.broker.publish_starts(starts, rebuilding=rebuilding)
        finally:
            self.publishing.difference_update(ids)

    async def publish_pending(self, starts: Sequence[StartObserver], *, rebuilding: bool = False) -> None:
        """``publish``, then end the starts' pending rows in a transaction of their own."""
        if not starts:
            return
        await self.publish(starts, rebuilding=rebuilding)
        async with self.sessions.begin() as session:
            await observers.mark_published(session, [start.observer_id for start in starts])
