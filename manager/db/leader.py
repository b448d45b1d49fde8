"""The statements behind the leader lock (``manager/state/leadership.py``): one PostgreSQL
session-level advisory lock that the manager applying state reports holds on a connection of
its own, and the question of who holds it.

The two-key form keeps it apart from the creates' per-pool locks (``pg_advisory_xact_lock``
with one key): PostgreSQL tells the two forms apart (``objsubid`` 1 and 2 in ``pg_locks``).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from manager.db.errors import sqlstates

# "orch" in ASCII, and the state side's lock within it (2 is the migrations', migrations/env.py).
_NAMESPACE = 0x6F726368
_STATE_SIDE = 1
_KEYS = {"a": _NAMESPACE, "b": _STATE_SIDE}


async def name_session(connection: AsyncConnection, name: str, silence_ms: int) -> bool:
    """Name the lock's session (``pg_stat_activity.application_name``) and have the server end
    it after ``silence_ms`` without a statement (``idle_session_timeout``, PostgreSQL 14 and
    later). False when the server does not know that setting."""
    await connection.execute(text("SELECT set_config('application_name', :name, false)"), {"name": name})
    try:
        await connection.execute(text("SELECT set_config('idle_session_timeout', :ms, false)"), {"ms": str(silence_ms)})
    except DBAPIError:  # 42704 before PostgreSQL 14
        return False
    return True


async def try_lock(connection: AsyncConnection) -> bool:
    return bool(await connection.scalar(text("SELECT pg_try_advisory_lock(:a, :b)"), _KEYS))


# One write (migration 0017): a hot standby, or a primary set read-only for a switchover,
# grants the advisory lock but refuses this.
_WRITE = text(
    "INSERT INTO leader (id, name, at) VALUES (1, :name, now()) "
    "ON CONFLICT (id) DO UPDATE SET name = excluded.name, at = excluded.at"
)
_READ_ONLY = "25006"  # read_only_sql_transaction


async def still_here(connection: AsyncConnection, name: str) -> None:
    """One write on the lock's session: resets its idle clock and proves that the session is
    alive and its server a writable primary."""
    await connection.execute(_WRITE, {"name": name})


def refused_as_read_only(error: BaseException) -> bool:
    return _READ_ONLY in sqlstates(error)


# The name of the session that holds this database's lock (the leader's name); no row when
# nobody does. An advisory lock belongs to its database: another deployment's manager on the
# same server holds a lock of the same keys in its own.
# The keys are constants, written into the text so that ``GET /api/stats`` can embed it.
HOLDER_SQL = (
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    f"WHERE l.locktype = 'advisory' AND l.classid = {_NAMESPACE} AND l.objid = {_STATE_SIDE} "
    "AND l.objsubid = 2 AND l.granted "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1"
)
