"""The API's writes against concurrent transactions on a real PostgreSQL: a stop that loses
a deadlock is run again. (Issue #11, reliability.)"""

from __future__ import annotations

import asyncio

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.harness import System

_LOCK_ROW = text("SELECT id FROM observers WHERE id = :id FOR UPDATE")


async def wait_blocked_on_a_lock(engine: AsyncEngine, fragment: str) -> None:
    """Until a backend of this database waits for a row lock in a query containing
    ``fragment``. Each look in a transaction of its own: pg_stat_activity is a snapshot
    taken once per transaction."""
    waiting = text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE :q"
    )
    for _ in range(300):
        async with engine.connect() as conn:
            if (await conn.execute(waiting, {"q": f"%{fragment}%"})).scalar_one():
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no query with {fragment!r} ever waited for a lock")


async def test_a_stop_that_loses_a_deadlock_is_run_again(system: System) -> None:
    # Given two Processing observers (no inventories: their report would lock rows too)
    manager = system.start_manager()
    system.start_service("svc-a", workers=4, ORCH_INVENTORY_S="3600")
    first, second = sorted(system.create(f"o-{i}")["id"] for i in range(2))  # the API locks in id order
    for oid in (first, second):
        system.wait_status(oid, "Processing")

    engine = create_async_engine(system.database_url)
    try:
        async with engine.connect() as other:
            # Another transaction holds the second row; PostgreSQL's deadlock check runs in
            # the backend that waited deadlock_timeout first: a long one here makes the
            # API's transaction the one aborted.
            await other.execute(text("SET deadlock_timeout = '60s'"))
            await other.execute(_LOCK_ROW, {"id": second})
            # When a bulk stop of both locks the first and waits for the second...
            stop = asyncio.create_task(
                asyncio.to_thread(system.post, "/api/observers/bulk-stop", {"ids": [first, second]})
            )
            await wait_blocked_on_a_lock(engine, "FOR UPDATE")
            # ...and the other transaction then wants the first: a deadlock
            await other.execute(_LOCK_ROW, {"id": first})
            await other.commit()
        response = await stop
    finally:
        await engine.dispose()

    # Then the stop lost, ran again once the other transaction ended, and was accepted
    assert response.status_code == 202, response.text
    assert sorted(response.json()["stopping"]) == [first, second]
    assert "stop lost a race" in manager.text() and "40P01" not in response.text
    for oid in (first, second):
        system.wait_status(oid, "Deleted")
