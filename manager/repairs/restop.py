"""Stops still OnDeleting after ``ORCH_RESTOP_AFTER_S`` are broadcast again (seed scenario 5:
the stop may have reached no service while the observer was being redistributed)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db import observers
from manager.metrics import STOP_RESENDS
from manager.repairs.base import Repair
from shared.messages import stop_messages

logger = logging.getLogger(__name__)


class Restop(Repair):
    name = "restop"

    def __init__(self, sessions: async_sessionmaker[AsyncSession], broker: BrokerLink, after_s: float) -> None:
        self.sessions = sessions
        self.broker = broker
        self.after_s = after_s
        self.period_s = after_s / 4

    async def run(self) -> None:
        async with self.sessions.begin() as session:
            rows = await observers.touch_stale_stops(session, datetime.now(UTC), timedelta(seconds=self.after_s))
        ids = [i for i, _ in rows]
        for message in stop_messages(ids, "stop requested (again)", lives=[life for _, life in rows]):
            await self.broker.publish_control(message)
        if ids:
            STOP_RESENDS.inc(len(ids))
            logger.info("re-broadcast %d stop(s) still OnDeleting", len(ids))
