"""The balancer's reading of the rows (``manager.balance.fleet``) against a real PostgreSQL:
which pools hold an observer whose start the broker keeps for an ended session, the rows
that hold a pool's evening back (``manager/balance/rounds.py``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.balance import fleet as fleet_rows

_INSERT = text(
    "INSERT INTO observers (id, name, kind, pool, status, service_id, awaiting_broker_since) "
    "VALUES (:id, :name, 'ticker', :pool, CAST(:status AS observer_status), :service, :since)"
)


async def test_the_pools_awaiting_the_broker_are_those_with_a_recent_mark_on_a_created_row_of_no_service(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    now = datetime.now(UTC)
    service = uuid.uuid4()
    rows = [
        ("waits", "Created", None, now - timedelta(seconds=2)),  # a dead node's start, held by the queue
        ("waits", "Created", None, now - timedelta(seconds=3)),
        ("old-mark", "Created", None, now - timedelta(seconds=600)),  # the lost-start repair's by now
        ("started", "Processing", service, None),  # its start came back and runs
        ("marked-but-running", "Processing", service, now),  # by status, not by the mark alone
        ("marked-but-taken", "Created", service, now),
        ("unmarked", "Created", None, None),  # a new create, not held for anyone
    ]
    async with sessions.begin() as s:
        for i, (pool, status, on, since) in enumerate(rows):
            values = {"id": uuid.uuid4(), "name": f"o-{i}", "pool": pool, "status": status, "service": on}
            await s.execute(_INSERT, values | {"since": since})
    async with sessions() as s:
        assert await fleet_rows.awaiting_broker(s, now - timedelta(seconds=300)) == {"waits"}
        assert await fleet_rows.awaiting_broker(s, now - timedelta(seconds=900)) == {"waits", "old-mark"}


async def test_the_starts_in_flight_are_the_created_rows_of_each_pool_changed_lately(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    now = datetime.now(UTC)
    rows = [
        ("burst", "Created", now - timedelta(seconds=1)),  # published, no report yet
        ("burst", "Created", now - timedelta(seconds=5)),  # a restart after its service died
        ("burst", "Processing", now),  # its report applied: in a service's count
        ("burst", "Scheduled", now),  # not published before its time
        ("stuck", "Created", now - timedelta(seconds=600)),  # waits for a kind no service runs
        ("other", "Created", now - timedelta(seconds=2)),
    ]
    insert = text(
        "INSERT INTO observers (id, name, kind, pool, status, modified_at, awaiting_broker_since) "
        "VALUES (:id, :name, 'ticker', :pool, CAST(:status AS observer_status), :at, :held)"
    )
    async with sessions.begin() as s:
        for i, (pool, status, at) in enumerate(rows):
            values = {"id": uuid.uuid4(), "name": f"f-{i}", "pool": pool, "status": status, "at": at}
            await s.execute(insert, values | {"held": None})
        # A dead node's start, held by its queue: dealt to no service yet
        values = {"id": uuid.uuid4(), "name": "held", "pool": "other", "status": "Created", "at": now}
        await s.execute(insert, values | {"held": now})
    async with sessions() as s:
        assert await fleet_rows.in_flight(s, now - timedelta(seconds=60)) == {"burst": 2, "other": 1}
