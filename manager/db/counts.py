"""Observer counts per (kind, pool, status), kept by triggers (migration 0003).

Stats, metrics and the capacity check read these instead of counting the observers
table, which grows with every observer ever created: two ``GROUP BY`` scans of it were most
of ``GET /api/stats`` (figures: docs/benchmarks.md, "What the figures say").
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import BigInteger, ScalarSelect, column, text
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.models import HOLDING_STATUSES, ObserverStatus

_ALL = """
    SELECT kind, pool, status, n FROM observer_counts
    UNION ALL
    SELECT kind, pool, status, n FROM observer_count_deltas
"""

# Every non-zero (kind, pool, status) count; ``manager.db.services.stats`` embeds it.
READ_SQL = (
    f"SELECT kind, pool, status::text AS status, sum(n) AS n FROM ({_ALL}) AS c GROUP BY 1, 2, 3 HAVING sum(n) <> 0"
)
_READ = text(READ_SQL)

# Observers of the statuses :live, summed over every kind and pool.
LIVE_TOTAL_SQL = f"SELECT coalesce(sum(n), 0) FROM ({_ALL}) AS c WHERE status::text = ANY(:live)"

_LIVE_IN_POOL = (
    f"SELECT coalesce(sum(n), 0) AS n FROM ({_ALL}) AS c WHERE pool = :pool AND status::text = ANY(:statuses)"
)

# Deleting the deltas and adding them up happen in one statement: concurrent folds (two
# managers) each move only rows they deleted, and a reader sees them before or after. Rows
# are locked in key order, so two folds never wait for each other in a cycle.
_FOLD = text(
    """
    WITH moved AS (DELETE FROM observer_count_deltas RETURNING kind, pool, status, n)
    INSERT INTO observer_counts (kind, pool, status, n)
    SELECT kind, pool, status, sum(n) FROM moved GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (kind, pool, status) DO UPDATE SET n = observer_counts.n + EXCLUDED.n
    """
)


@dataclass(frozen=True, slots=True)
class Count:
    kind: str
    pool: str
    status: ObserverStatus
    n: int


async def observer_counts(session: AsyncSession) -> list[Count]:
    """Every non-zero (kind, pool, status) count."""
    rows = (await session.execute(_READ)).all()
    return [Count(kind, pool, ObserverStatus(status), int(n)) for kind, pool, status, n in rows]


def live_in_pool_query(pool: str) -> ScalarSelect[int]:
    """Observers of ``pool`` that hold (or wait for) a worker: Created, Processing, OnDeleting,
    and Scheduled (whose worker is reserved until its start), as a scalar subquery (the
    capacity check reads it with the pool's workers)."""
    query = text(_LIVE_IN_POOL).bindparams(pool=pool, statuses=[s.value for s in HOLDING_STATUSES])
    return query.columns(column("n", BigInteger)).subquery().select().scalar_subquery()


async def fold_deltas(session: AsyncSession) -> None:
    """Move the pending deltas into the counts (the fold_counts repair, every round)."""
    await session.execute(_FOLD)
