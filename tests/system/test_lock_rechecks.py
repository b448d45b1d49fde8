"""The state consumer locks rows that other transactions change meanwhile, against a real
PostgreSQL (issue 17: a busy database is not a stuck one).

A ``SELECT ... FOR NO KEY UPDATE`` that finds a row changed since its snapshot rechecks it
(EvalPlanQual), and a recheck rescans the statement's bitmap index scans: with
``id = ANY(array)`` as their condition each rescan sorted the whole array again. An
inventory of 3,334 rows racing the broker-loss rebuild's release of the same rows took
11.5 s of PostgreSQL's CPU (``perf``: qsort in ``_bt_preprocess_array_keys`` under
``EvalPlanQualNext``), and the rebuild waited for it: ``make bench``'s broker-loss took 13 to
14 s in 2 of 4 runs instead of 2.7. Rows are now found unlocked, then locked through
a semi-join with their ids (``manager.db.sql.lock_by_ids``).

Each test holds the first row, lets the consumer's lock wait on it, changes every other row in
a third transaction, then lets go: every row the consumer locks after that is rechecked. A
statement timeout far above what the semi-join takes (2.4 s for the whole test here, inserting
100,000 rows included) turns the old cost into a failure: the first test ran into it (20 s)
with the single locking statement. The preload test passed with it too (its plan read the
rows without a bitmap): it checks the semi-join returns every row under the race.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.db.models import Observer, ObserverStatus
from manager.db.sql import id_in
from manager.state.rows import ObserverRows, Row
from tests.system.test_write_races import wait_blocked_on_a_lock

# Rows in the table and, of them, the ones the consumer locks.
TABLE_ROWS = 100_000
LOCKED_ROWS = 20_000
_TIMEOUT = "20s"

_INSERT = text(
    "INSERT INTO observers (id, name, kind, pool, status, service_id, host_session_id) "
    "SELECT id, 'o-' || id, 'ticker', 'default', 'Processing', :service_id, :session_id "
    "FROM unnest(CAST(:ids AS uuid[])) AS v(id)"
)


async def _race(
    sessions: async_sessionmaker[AsyncSession],
    lock: Callable[[ObserverRows, list[uuid.UUID]], Awaitable[list[Row]]],
    plans: str,
) -> tuple[list[uuid.UUID], list[Row]]:
    """``lock`` runs in a transaction of its own while the first of its rows is held and every
    other one is changed by a transaction that commits after its snapshot. ``plans``: how
    PostgreSQL plans its statements (``plan_cache_mode``). asyncpg prepares every statement;
    PostgreSQL plans the first five runs for their parameters (custom: a large array read
    through a bitmap of the index) and may then plan once for any (generic: an array guessed
    at a few ids, an index scan, or a bitmap per array where conditions are ORed)."""
    service_id, session_id = uuid.uuid4(), uuid.uuid4()
    every = sorted(uuid.uuid4() for _ in range(TABLE_ROWS))
    wanted = every[:: TABLE_ROWS // LOCKED_ROWS]
    shuffled = random.sample(wanted, len(wanted))  # as a set of ids comes: not in the index's order
    async with sessions.begin() as s:
        await s.execute(_INSERT, {"ids": every, "service_id": service_id, "session_id": session_id})
        await s.execute(text("ANALYZE observers"))

    async def consumer() -> list[Row]:
        async with sessions.begin() as s:
            await s.execute(text(f"SET LOCAL statement_timeout = '{_TIMEOUT}'"))
            await s.execute(text(f"SET LOCAL plan_cache_mode = {plans}"))
            return await lock(ObserverRows(s), shuffled)

    engine = sessions.kw["bind"]
    async with engine.connect() as holder:
        await holder.execute(text("SELECT id FROM observers WHERE id = :id FOR UPDATE"), {"id": wanted[0]})
        task = asyncio.create_task(consumer())
        await wait_blocked_on_a_lock(engine, "FOR NO KEY UPDATE")
        async with sessions.begin() as s:  # every other row changes after the consumer's snapshot
            await s.execute(
                text("UPDATE observers SET modified_at = now() WHERE id = ANY(CAST(:ids AS uuid[])) AND id <> :first"),
                {"ids": wanted, "first": wanted[0]},
            )
        await holder.commit()
    return wanted, await asyncio.wait_for(task, 300)


async def test_rows_matched_by_a_condition_are_locked_without_resorting_its_ids(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    # Given rows the consumer selects by a condition on two large id arrays (as an inventory
    # names the ids a service listed and the rows on its service), while another transaction
    # changes them
    async def lock(rows: ObserverRows, ids: list[uuid.UUID]) -> list[Row]:
        listed, on_service = set(ids[::2]), set(ids[1::2])
        return await rows.matching(
            (id_in(Observer.id, listed) | id_in(Observer.id, on_service))
            & (Observer.status == ObserverStatus.PROCESSING),
            lambda row: (row.id in listed or row.id in on_service) and row.status == ObserverStatus.PROCESSING,
        )

    wanted, rows = await _race(sessions, lock, "force_generic_plan")
    # Then every row is locked and returned as the other transaction left it
    assert sorted(row.id for row in rows) == wanted


async def test_rows_preloaded_by_id_are_locked_without_resorting_their_ids(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    # Given a batch of reports naming many observers that another transaction changes
    async def lock(rows: ObserverRows, ids: list[uuid.UUID]) -> list[Row]:
        await rows.preload(set(ids))
        return [row for oid in ids if (row := await rows.get(oid)) is not None]

    wanted, rows = await _race(sessions, lock, "force_custom_plan")
    assert sorted(row.id for row in rows) == wanted


async def test_a_row_that_stops_matching_while_locked_is_not_returned(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    # Given a Processing row the consumer selects as Processing while another transaction
    # holds it and makes it OnDeleting
    oid = uuid.uuid4()
    async with sessions.begin() as s:
        await s.execute(_INSERT, {"ids": [oid], "service_id": uuid.uuid4(), "session_id": uuid.uuid4()})

    async def consumer() -> list[Row]:
        async with sessions.begin() as s:
            return await ObserverRows(s).matching(
                id_in(Observer.id, [oid]) & (Observer.status == ObserverStatus.PROCESSING),
                lambda row: row.id == oid and row.status == ObserverStatus.PROCESSING,
            )

    engine = sessions.kw["bind"]
    async with engine.connect() as other:
        await other.execute(text("SELECT id FROM observers WHERE id = :id FOR UPDATE"), {"id": oid})
        task = asyncio.create_task(consumer())
        await wait_blocked_on_a_lock(engine, "FOR NO KEY UPDATE")
        await other.execute(text("UPDATE observers SET status = 'OnDeleting' WHERE id = :id"), {"id": oid})
        await other.commit()
    # Then the consumer does not get it: it no longer matches
    assert await asyncio.wait_for(task, 60) == []
