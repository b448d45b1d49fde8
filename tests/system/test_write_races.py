"""The API's writes against concurrent transactions on a real PostgreSQL: a stop that loses
a deadlock is run again, and a restart whose start could not be published does not undo a
report that landed meanwhile. (Issue #11, reliability.)"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from manager.admission import Admission
from manager.broker import BrokerLink
from manager.commands import ObserverCommands
from manager.db.models import Observer, ObserverStatus, PendingStart
from manager.errors import Unavailable
from manager.settings import ManagerSettings
from shared.messages import RetryPolicy, StartObserver
from tools.harness import System

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
            await wait_blocked_on_a_lock(engine, "FOR NO KEY UPDATE")
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


# --- restart: the failure path is a compare-and-set ----------------------------------------


class BrokerDownWhileAReportLands(BrokerLink):
    """The real link, never connected (so publishing fails as while the broker is down);
    ``meanwhile`` runs first, as a report applied by the state consumer during the publish."""

    def __init__(self, settings: ManagerSettings, meanwhile: Callable[[], Awaitable[None]]) -> None:
        super().__init__(settings)
        self.meanwhile = meanwhile

    async def publish_starts(self, starts: Sequence[StartObserver], *, rebuilding: bool = False) -> None:
        await self.meanwhile()
        await super().publish_starts(starts, rebuilding=rebuilding)


async def failed_observer(sessions: async_sessionmaker[AsyncSession]) -> tuple[uuid.UUID, uuid.UUID]:
    """(a Failed observer, a live service with room in its pool)."""
    oid, sid = uuid.uuid4(), uuid.uuid4()
    async with sessions.begin() as session:
        await session.execute(
            text(
                "INSERT INTO services (id, name, workers_count, pools, status) "
                "VALUES (:sid, 'svc', 5, '[\"default\"]', 'alive')"
            ),
            {"sid": sid},
        )
        await session.execute(
            text("INSERT INTO observers (id, name, kind, status) VALUES (:oid, 'o', 'ticker', 'Failed')"), {"oid": oid}
        )
    return oid, sid


async def row(sessions: async_sessionmaker[AsyncSession], oid: uuid.UUID) -> tuple[Observer, bool]:
    """The observer and whether its start is still pending."""
    async with sessions() as session:
        observer = await session.get_one(Observer, oid)
        pending = (
            await session.scalar(select(PendingStart.observer_id).where(PendingStart.observer_id == oid))
        ) is not None
        return observer, pending


async def test_a_restart_that_cannot_publish_stays_failed(
    sessions: async_sessionmaker[AsyncSession], database: str
) -> None:
    oid, _ = await failed_observer(sessions)

    async def nothing() -> None:
        pass

    broker = BrokerDownWhileAReportLands(ManagerSettings(database_url=database), nothing)
    commands = ObserverCommands(sessions, broker, RetryPolicy(), Admission(100))
    with pytest.raises(Unavailable, match="stays Failed"):
        await commands.restart(oid)
    observer, pending = await row(sessions, oid)
    assert observer.status == ObserverStatus.FAILED and not pending


async def test_a_restart_that_cannot_publish_keeps_a_report_that_landed_meanwhile(
    sessions: async_sessionmaker[AsyncSession], database: str
) -> None:
    # Given a Failed observer whose restart's start is not confirmed, while a service
    # reports it started (its start reached the service although the confirm did not)
    oid, sid = await failed_observer(sessions)

    async def started_on_the_service() -> None:
        async with sessions.begin() as session:
            await session.execute(
                text(
                    "UPDATE observers SET status = 'Processing', service_id = :sid, modified_at = now() "
                    "WHERE id = :oid AND status = 'Created'"
                ),
                {"sid": sid, "oid": oid},
            )

    broker = BrokerDownWhileAReportLands(ManagerSettings(database_url=database), started_on_the_service)
    commands = ObserverCommands(sessions, broker, RetryPolicy(), Admission(100))

    # When the restart's failure path runs
    answered = await commands.restart(oid)

    # Then the report stands (not overwritten with Failed); the pending start stays for the
    # pending-start repair, as after a crash between commit and publish
    observer, pending = await row(sessions, oid)
    assert answered.status == observer.status == ObserverStatus.PROCESSING and observer.service_id == sid
    assert pending
