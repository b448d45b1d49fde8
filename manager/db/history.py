"""The one statement behind each sample of the dashboard's history (``manager/history/``).

It reads only what is cheap at any fleet size: the counts tables (a few rows per kind, pool
and status), the alive services' rows (``running`` is their last heartbeat's load), the
history's highest id (the primary key's last entry) and the ``moved`` events above two
floors (a range of the primary key that ``manager.history.moves`` keeps to the last minute
or two).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import JSON, BigInteger, column, text
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.counts import READ_SQL

_SAMPLE = text(
    f"""
    SELECT
        (SELECT coalesce(json_object_agg(status, n), '{{}}')
            FROM (SELECT status, sum(n) AS n FROM ({READ_SQL}) AS c GROUP BY 1) AS s) AS statuses,
        (SELECT coalesce(json_agg(json_build_array(id::text, name, running, workers_count) ORDER BY name, id), '[]')
            FROM services WHERE status = 'alive') AS services,
        (SELECT max(id) FROM observer_events) AS max_id,
        m.above_lo,
        m.above_next
    FROM (
        SELECT count(*) AS above_lo, count(*) FILTER (WHERE id > :next_lo) AS above_next
        FROM observer_events WHERE id > :lo AND event = 'moved'
    ) AS m
    """
).columns(
    column("statuses", JSON),
    column("services", JSON),
    column("max_id", BigInteger),
    column("above_lo", BigInteger),
    column("above_next", BigInteger),
)


@dataclass(frozen=True, slots=True)
class SampleRead:
    statuses: dict[str, int]
    services: list[tuple[str, str, int, int]]  # (id, name, running, workers) of alive services
    max_id: int | None
    moved_above_lo: int
    moved_above_next: int


async def read_sample(session: AsyncSession, lo: int, next_lo: int) -> SampleRead:
    row = (await session.execute(_SAMPLE, {"lo": lo, "next_lo": next_lo})).one()
    return SampleRead(
        statuses={status: int(n) for status, n in row.statuses.items()},
        services=[(i, name, int(running), int(workers)) for i, name, running, workers in row.services],
        max_id=row.max_id,
        moved_above_lo=int(row.above_lo),
        moved_above_next=int(row.above_next),
    )
