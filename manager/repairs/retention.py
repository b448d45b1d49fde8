"""How long history is kept (issue 15): ``observer_events`` would otherwise grow for ever
(every failover and retry of every observer appends a row; at 1,000,000 observers it becomes
the largest table).

Events older than ``ORCH_EVENTS_RETENTION_DAYS`` (30 by default; 0 keeps everything) are
deleted by the manager's repairs, up to ``BATCH`` rows per pass (a pass every
``EVERY_S``, and at once again while a pass finds a full batch), oldest first.
The table is append-only, so its ids follow time: a pass reads the lowest ids through the
primary key (no index on ``at`` needed) and deletes those older than the window, stopping at
the first one inside it (``manager/db/events.py``). What reads history stays correct: probation counts ``host_lost`` and
``moved`` events within minutes, far inside any window; a long-lived observer's page loses
its oldest events (its ``created`` among them), which is what a retention window means.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.db import events
from manager.db import probation as probation_rows

logger = logging.getLogger(__name__)

BATCH = 10_000
EVERY_S = 60.0


async def prune_events(sessions: async_sessionmaker[AsyncSession], days: float) -> int:
    """Delete one batch of events older than ``days``; returns how many were deleted."""
    if days <= 0:
        return 0
    cutoff = datetime.now(UTC) - timedelta(days=days)
    async with sessions.begin() as session:
        deleted = await events.delete_oldest(session, cutoff, BATCH)
        # The record of service deaths (a row per death, read within the probation window) goes
        # with the history of the same age.
        await probation_rows.forget_deaths(session, cutoff)
    if deleted:
        logger.info("deleted %d history event(s) older than %g day(s)", deleted, days)
    return deleted
