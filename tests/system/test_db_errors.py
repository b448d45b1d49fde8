"""The database error classifier against real faults of a real PostgreSQL: each fault is
caused for real and the exception SQLAlchemy + asyncpg raise for it is classified."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from manager.db.errors import is_lost_race, is_transient, sqlstates
from tools import infra
from tools.harness import free_port, unique


async def raised(work: Callable[[], Awaitable[Any]]) -> Exception:
    try:
        await work()
    except Exception as e:  # noqa: BLE001 - the point is to look at it
        return e
    raise AssertionError("no exception raised")


@pytest.fixture
async def engine(database: str) -> AsyncIterator[AsyncEngine]:
    eng = create_async_engine(database, pool_pre_ping=True)
    yield eng
    await eng.dispose()


async def running_query(postgres: infra.PostgresNode, pid: int, fragment: str) -> None:
    """Until backend ``pid`` is running a query that contains ``fragment``."""
    sql = f"SELECT query FROM pg_stat_activity WHERE pid = {pid} AND state = 'active'"
    for _ in range(300):
        if fragment in await asyncio.to_thread(postgres.psql, sql):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"backend {pid} never ran {fragment}")


async def select_one(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


async def test_a_database_that_refuses_connections_is_transient(
    database: str, engine: AsyncEngine, postgres: infra.PostgresNode
) -> None:
    name = make_url(database).database
    postgres.psql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    try:
        error = await raised(lambda: select_one(engine))
    finally:
        postgres.psql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    assert "55000" in sqlstates(error) and "not currently accepting connections" in str(error)
    assert is_transient(error)


async def test_a_terminated_session_is_transient(engine: AsyncEngine, postgres: infra.PostgresNode) -> None:
    async with engine.connect() as conn:
        pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        sleeping = asyncio.create_task(conn.execute(text("SELECT pg_sleep(30)")))
        await running_query(postgres, pid, "pg_sleep")
        await asyncio.to_thread(postgres.psql, f"SELECT pg_terminate_backend({pid})")
        error = await raised(lambda: sleeping)
    assert {"08003", "57P01"} <= set(sqlstates(error))
    assert is_transient(error)


async def test_a_closed_pooled_connection_is_transient(database: str, postgres: infra.PostgresNode) -> None:
    eng = create_async_engine(database, pool_pre_ping=False)
    try:
        async with eng.connect() as conn:
            pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        postgres.psql(f"SELECT pg_terminate_backend({pid})")
        error = await raised(lambda: select_one(eng))
        # "connection is closed", or 08003 if the client reads the termination notice first
        assert isinstance(error, DBAPIError) and error.connection_invalidated
        assert is_transient(error)
        await select_one(eng)  # the invalidated connection was replaced
    finally:
        await eng.dispose()


async def test_too_many_connections_is_transient(database: str, postgres: infra.PostgresNode) -> None:
    role = unique("limited")
    postgres.psql(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' CONNECTION LIMIT 1")  # superusers have no limit
    url = make_url(database).set(username=role, password="pw")
    first, second = create_async_engine(url), create_async_engine(url)
    try:
        async with first.connect() as conn:
            await conn.execute(text("SELECT 1"))
            error = await raised(lambda: select_one(second))
    finally:
        await first.dispose()
        await second.dispose()
        postgres.psql(f"DROP ROLE {role}")
    assert "53300" in sqlstates(error)
    assert is_transient(error)


async def test_a_full_pool_and_a_refused_connection_are_transient(database: str) -> None:
    small = create_async_engine(database, pool_size=1, max_overflow=0, pool_timeout=0.2)
    nowhere = create_async_engine(make_url(database).set(port=free_port()))
    try:
        async with small.connect() as conn:
            await conn.execute(text("SELECT 1"))
            full = await raised(lambda: select_one(small))
        refused = await raised(lambda: select_one(nowhere))
    finally:
        await small.dispose()
        await nowhere.dispose()
    assert "QueuePool limit" in str(full) and is_transient(full)
    assert isinstance(refused, ConnectionRefusedError) and is_transient(refused)


async def test_a_deadlock_is_a_lost_race(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE t (id int PRIMARY KEY, v int)"))
        await conn.execute(text("INSERT INTO t VALUES (1, 0), (2, 0)"))
    locked = [asyncio.Event(), asyncio.Event()]

    async def cross(first: int, second: int, mine: asyncio.Event, theirs: asyncio.Event) -> None:
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE t SET v = v + 1 WHERE id = :id"), {"id": first})
            mine.set()
            await theirs.wait()
            await conn.execute(text("UPDATE t SET v = v + 1 WHERE id = :id"), {"id": second})

    results = await asyncio.gather(
        cross(1, 2, locked[0], locked[1]), cross(2, 1, locked[1], locked[0]), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 1, results
    assert "40P01" in sqlstates(errors[0])
    assert is_lost_race(errors[0]) and is_transient(errors[0])


async def test_deterministic_errors_are_not_transient(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE u (id int PRIMARY KEY)"))
        await conn.execute(text("CREATE SEQUENCE s"))
        await conn.execute(text("INSERT INTO u VALUES (1)"))

    async def run(sql: str) -> None:
        async with engine.begin() as conn:
            await conn.execute(text(sql))

    duplicate = await raised(lambda: run("INSERT INTO u VALUES (1)"))
    syntax = await raised(lambda: run("SELEC 1"))
    # 55000 on a live connection is a misuse, not a database refusing connections
    no_currval = await raised(lambda: run("SELECT currval('s')"))
    assert "23505" in sqlstates(duplicate) and "42601" in sqlstates(syntax) and "55000" in sqlstates(no_currval)
    for error in (duplicate, syntax, no_currval):
        assert not is_transient(error) and not is_lost_race(error), error
