"""Run a transaction again when it lost a race with another one.

PostgreSQL aborts one transaction of a deadlock (40P01) or of a serialization conflict
(40001); the other commits and the aborted one would succeed if run again. The API's write
transactions share rows with the state consumer, which retries by itself; this gives the
API the same few chances before its answer becomes a 503 (``manager.db.errors``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from manager.db.errors import describe, is_lost_race

logger = logging.getLogger(__name__)

T = TypeVar("T")

ATTEMPTS = 3


async def retry_lost_races(transaction: Callable[[], Awaitable[T]], what: str, attempts: int = ATTEMPTS) -> T:
    """``await transaction()``, called again (at most ``attempts`` calls in all) while it
    fails with a deadlock or a serialization failure. ``transaction`` must open its own
    transaction, so that each call starts afresh. No pause between calls: the winner
    already holds the locks, so the new attempt simply queues behind it."""
    attempt = 1
    while True:
        try:
            return await transaction()
        except Exception as e:
            if attempt >= attempts or not is_lost_race(e):
                raise
            logger.warning("%s lost a race (%s); attempt %d of %d", what, describe(e), attempt + 1, attempts)
        attempt += 1
