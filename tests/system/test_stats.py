"""``GET /api/stats`` reads everything in one statement (``manager.db.services.stats``): on a real
PostgreSQL, every part of the answer (observers per status and per kind, capacity per pool,
services per state, probation, observers awaiting the broker) comes out as the rows say,
whether the counts are folded yet or still pending deltas."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.db import services
from manager.db.counts import fold_deltas


async def _service(session: AsyncSession, status: str, pools: str, workers: int) -> uuid.UUID:
    sid = uuid.uuid4()
    await session.execute(
        text(
            "INSERT INTO services (id, name, workers_count, pools, status) "
            "VALUES (:sid, :name, :workers, CAST(:pools AS jsonb), CAST(:status AS service_status))"
        ),
        {"sid": sid, "name": f"svc-{sid}", "workers": workers, "pools": pools, "status": status},
    )
    return sid


async def _observers(
    session: AsyncSession,
    count: int,
    kind: str,
    pool: str,
    status: str,
    probation: bool = False,
    awaiting_broker: bool = False,
) -> None:
    await session.execute(
        text(
            "INSERT INTO observers (id, name, kind, pool, status, probation_since, awaiting_broker_since) "
            "SELECT id, 'o-' || id, :kind, :pool, "
            "CAST(:status AS observer_status), CASE WHEN :probation THEN now() END, "
            "CASE WHEN :awaiting THEN now() END "
            "FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, :count)) AS new"
        ),
        {
            "kind": kind,
            "pool": pool,
            "status": status,
            "probation": probation,
            "awaiting": awaiting_broker,
            "count": count,
        },
    )


async def test_stats_report_every_part_from_folded_counts_and_pending_deltas(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions.begin() as session:
        await _service(session, "alive", '["default", "gpu"]', 5)
        await _service(session, "alive", '["default"]', 3)
        await _service(session, "lost", '["gpu"]', 7)  # not capacity: only alive services serve
        await _service(session, "deleted", '["default"]', 11)
        await _observers(session, 4, "ticker", "default", "Processing")
        await _observers(session, 1, "ticker", "default", "Processing", probation=True)
        await _observers(session, 1, "probe", "gpu", "Created")
        await _observers(session, 1, "probe", "gpu", "Created", awaiting_broker=True)
        await _observers(session, 1, "probe", "gpu", "OnDeleting", probation=True)
        await fold_deltas(session)  # the rows so far counted in observer_counts, the rest below in deltas
        await _observers(session, 3, "ticker", "default", "Deleted", probation=True)  # not live: not on probation
        await _observers(session, 2, "probe", "default", "Failed")
        await _observers(session, 1, "ticker", "gpu", "Processing", awaiting_broker=True)  # stale: started since
        await _observers(session, 2, "ticker", "default", "Scheduled")  # its worker is reserved: used

    async with sessions() as session:
        stats = await services.stats(session)

    assert stats == {
        "observers": {"Scheduled": 2, "Created": 2, "Processing": 6, "OnDeleting": 1, "Deleted": 3, "Failed": 2},
        "services": {"alive": 2, "lost": 1, "deleted": 1},
        "capacity": {
            "default": {"total": 8, "used": 7, "free": 1},
            "gpu": {"total": 5, "used": 4, "free": 1},
        },
        "kinds": {
            "probe": {"Created": 2, "OnDeleting": 1, "Failed": 2},
            "ticker": {"Processing": 6, "Deleted": 3, "Scheduled": 2},
        },
        "probation": 2,
        "paused": 1,  # the Processing one on probation: not in a child process yet
        "awaiting_broker": 1,  # the Created one on no service; the Processing one's mark is stale
        "state_applied_by": None,  # no manager runs
    }


async def test_stats_of_an_empty_system(sessions: async_sessionmaker[AsyncSession]) -> None:
    async with sessions() as session:
        stats = await services.stats(session)

    assert stats == {
        "observers": {"Scheduled": 0, "Created": 0, "Processing": 0, "OnDeleting": 0, "Deleted": 0, "Failed": 0},
        "services": {"alive": 0, "lost": 0, "deleted": 0},
        "capacity": {},
        "kinds": {},
        "probation": 0,
        "paused": 0,
        "awaiting_broker": 0,
        "state_applied_by": None,
    }
