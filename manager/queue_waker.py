"""Keeps the start queues that hold many messages from hibernating.

A classic queue's process hibernates after about a second without a call (gen_server2's
backoff), and hibernating compacts its whole heap; the next call wakes it, and the heap is
rebuilt. Something wakes an idle queue every minute or two, so with a million held
deliveries that cycle was most of the broker's idle share. A passive declare of the queue is
a call to its process: one every half second keeps it awake, and awake it keeps its heap
without growing the broker's memory per held observer (figures: docs/cost-curve.md).

Only a pool whose live observers (Created, Processing, OnDeleting: each one a message in its
start queue) reach ``start_queue_keep_awake_from`` is kept awake: a small queue's compaction
costs next to nothing, and a hibernating process takes the least memory.

The declares go on a connection of the manager's own (``BrokerProbes.touch_start_queues``), not
on its publishing channel; no service's lease or heartbeat shares anything with them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db.counts import observer_counts
from manager.db.models import LIVE_STATUSES
from manager.metrics import START_QUEUES_KEPT_AWAKE
from manager.settings import ManagerSettings

logger = logging.getLogger(__name__)


async def pools_to_keep_awake(session: AsyncSession, keep_awake_from: int) -> list[str]:
    """The pools with at least ``keep_awake_from`` live observers."""
    live: collections.Counter[str] = collections.Counter()
    for count in await observer_counts(session):
        if count.status in LIVE_STATUSES:
            live[count.pool] += count.n
    return sorted(pool for pool, n in live.items() if n >= keep_awake_from)


class StartQueueWaker:
    def __init__(
        self, settings: ManagerSettings, sessions: async_sessionmaker[AsyncSession], broker: BrokerLink
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.broker = broker

    async def run(self) -> None:
        """Until cancelled. Failures are logged (once until it works again), never raised."""
        keep_awake_from = self.settings.start_queue_keep_awake_from
        if keep_awake_from == 0:
            return
        pools: list[str] = []
        next_read = 0.0
        failing = False
        while True:
            try:
                if time.monotonic() >= next_read:
                    next_read = time.monotonic() + self.settings.start_queue_keep_awake_read_s
                    async with self.sessions() as session:
                        pools = await pools_to_keep_awake(session, keep_awake_from)
                    START_QUEUES_KEPT_AWAKE.set(len(pools))
                if pools and self.broker.ready.is_set():
                    await self.broker.probes.touch_start_queues(pools)
                failing = False
            except Exception as e:  # noqa: BLE001 - the broker or the database: the waker goes on
                if not failing:
                    logger.warning("cannot keep the start queues awake (%s); trying on", e)
                failing = True
            await asyncio.sleep(self.settings.start_queue_keep_awake_s)
