"""The API's read sessions (``manager.db.engine.make_engine(read_only=True)``) on a real PostgreSQL:
no transaction wraps their statements, and they cannot write."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from manager.db.engine import make_engine, make_sessionmaker


async def test_each_statement_of_a_read_session_is_its_own_transaction(database: str) -> None:
    engine = make_engine(database, read_only=True)
    try:
        async with make_sessionmaker(engine)() as session:
            first = await session.scalar(text("SELECT now()"))
            await asyncio.sleep(0.05)
            # now() is when the transaction began: in a BEGIN ... ROLLBACK around the session's
            # statements (three round trips more per request) both would be the same instant.
            second = await session.scalar(text("SELECT now()"))
            assert (second - first).total_seconds() >= 0.05
    finally:
        await engine.dispose()


async def test_a_read_session_refuses_to_write(database: str) -> None:
    engine = make_engine(database, read_only=True)
    try:
        async with make_sessionmaker(engine)() as session:
            with pytest.raises(DBAPIError, match="read-only transaction"):
                await session.execute(text("DELETE FROM observers"))
    finally:
        await engine.dispose()
