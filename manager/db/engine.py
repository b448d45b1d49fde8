"""Engine, session factory, a ping, and the schema check done at start-up."""

from __future__ import annotations

import ast
import json
import ssl
from pathlib import Path
from typing import Any

import pydantic_core
from sqlalchemy import event, make_url, text
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS = REPO_ROOT / "migrations" / "versions"


class SchemaOutdated(RuntimeError):
    """The database's schema is not the one this manager was written for; ``behind``: an
    older one, which a migration will bring to the head (so it is worth waiting for)."""

    def __init__(self, message: str, *, behind: bool = False) -> None:
        super().__init__(message)
        self.behind = behind


def make_engine(
    url: str,
    *,
    read_only: bool = False,
    statement_timeout_s: float | None = None,
    lock_timeout_s: float | None = None,
    client_timeout_s: float | None = None,
    tls: ssl.SSLContext | None = None,
) -> AsyncEngine:
    """The engine of the manager's writers, or with ``read_only`` the API's reads (lists,
    gets, stats, metrics, readiness): autocommit, so a request costs PostgreSQL two round
    trips (the pre-ping and its query) instead of six. In a transaction, SQLAlchemy's asyncpg
    pre-ping is BEGIN, a ping and ROLLBACK (for pgbouncer), and the query is wrapped in BEGIN
    and ROLLBACK: on a busy machine every round trip waits for PostgreSQL's process and then
    for ours to be scheduled, and a list page's p99 was that waiting, not the query (figures:
    docs/bench-history.md, "2026-11-26: the slow machine"). Nothing is lost: READ COMMITTED
    takes a snapshot per statement anyway, and the server refuses writes there. A pool of its
    own, as the isolation level belongs to the connection."""
    # pool_pre_ping: a pooled connection that died with the server (restart, failover,
    # pg_terminate_backend) is replaced at checkout rather than failing its next user; a
    # disconnect seen mid-query also invalidates the rest of the pool (SQLAlchemy does it).
    # No JIT: PostgreSQL compiles a query whose estimated cost passes jit_above_cost, and an
    # array of ids inflates estimates, so the probation query of a big service's death was
    # compiled mid-failover (docs/cost-curve.md). Every query here is an index lookup or a
    # short scan.
    server_settings = {"jit": "off"}
    # A statement cancelled past these fails with 57014 or 55P03, transient errors (the API
    # answers 503 with Retry-After; manager/db/errors.py).
    if statement_timeout_s is not None:
        server_settings["statement_timeout"] = str(max(1, round(statement_timeout_s * 1000)))
    if lock_timeout_s is not None:
        server_settings["lock_timeout"] = str(max(1, round(lock_timeout_s * 1000)))
    connect_args: dict[str, Any] = {"server_settings": server_settings}
    if tls is not None:  # ``ManagerSettings.database_tls_context``: verified, host name included
        connect_args["ssl"] = tls
    # The server's timeouts need a server that answers. One cut off by the network (packets
    # dropped), frozen or gone without a reset answers nothing, and a request would wait as
    # long as TCP keeps trying (docs/design.md, invariant 14). asyncpg's own clock bounds each
    # statement and each connect; a statement it gives up on raises TimeoutError, an OSError,
    # which the API answers 503 (manager/db/errors.py).
    if client_timeout_s is not None:
        connect_args |= {"command_timeout": client_timeout_s, "timeout": client_timeout_s}
    options: dict[str, Any] = {"pool_size": 10, "max_overflow": 20}
    if read_only:
        server_settings["default_transaction_read_only"] = "on"
        options = {"isolation_level": "AUTOCOMMIT", "pool_size": 5, "max_overflow": 10}
        # Several hosts (a primary and its standbys) with target_session_attrs=read-write:
        # asyncpg judges read-write by default_transaction_read_only, which these sessions
        # set, so it would refuse every host. The primary is what the reads want.
        if make_url(url).query.get("target_session_attrs") is not None:
            connect_args["target_session_attrs"] = "primary"
    engine = create_async_engine(
        url,
        pool_pre_ping=True,
        json_deserializer=decode_json,
        connect_args=connect_args,
        **options,
    )
    if not read_only:
        event.listen(engine.sync_engine, "handle_error", _standby_is_a_disconnect)
    return engine


def _standby_is_a_disconnect(context: ExceptionContext) -> None:
    """A write refused as read-only (25006) comes from a server that is no longer the
    primary (demoted in a switchover, its connections kept): drop the pool's connections so
    the next one finds the new primary, and let the caller retry (a transient error)."""
    if getattr(context.original_exception, "sqlstate", None) == _READ_ONLY_SQL_TRANSACTION:
        context.is_disconnect = True


_READ_ONLY_SQL_TRANSACTION = "25006"


def decode_json(document: str) -> Any:
    """A JSONB value as read from PostgreSQL: pydantic-core's parser, several times as fast as
    ``json.loads``, which was a large share of a list page's CPU (figures: docs/design.md,
    "Keep the event loop cheap"). It refuses nesting past 200 levels, which the API's request
    parsing (``json.loads``) accepts, so such a stored value is read by the json module rather
    than failing every page that holds it."""
    try:
        return pydantic_core.from_json(document)
    except ValueError:
        return json.loads(document)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


async def ping(session: AsyncSession) -> None:
    """One round trip to the database (``/readyz``): raises if it does not answer."""
    await session.execute(text("SELECT 1"))


def _revision_graph(versions: Path) -> tuple[set[str], set[str]]:
    """(every revision, every revision some other names as its ``down_revision``), read from
    the files' assignments rather than through alembic's ``ScriptDirectory``, whose import
    (with mako and pygments) is a noticeable part of each manager process's start
    (docs/bench-history.md, "2026-11-26: the slow machine"), in the state process before it
    applies its first report: a restarted manager's backlog waits for it."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in versions.glob("*.py"):
        for node in ast.parse(path.read_text(), str(path)).body:
            target: ast.expr
            if isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            else:
                continue
            if not isinstance(target, ast.Name) or value is None:
                continue
            if target.id == "revision":
                revisions.add(ast.literal_eval(value))
            elif target.id == "down_revision":
                down = ast.literal_eval(value)
                parents.update(down if isinstance(down, tuple | list) else [down] if down else [])
    return revisions, parents


def head_revision(versions: Path = VERSIONS) -> str:
    """The migrations' head: the one revision no other names as its ``down_revision``
    (``tests/system/test_migrations.py`` checks this against alembic's own answer)."""
    revisions, parents = _revision_graph(versions)
    heads = revisions - parents
    if len(heads) != 1:
        raise SchemaOutdated(f"the migrations in {versions} have {len(heads)} heads ({sorted(heads)}), not one")
    return heads.pop()


async def check_schema(engine: AsyncEngine) -> None:
    """Refuse to run on a database whose schema is not at the migrations' head: one behind
    (a revision of ours, or none yet) may still be migrated (``SchemaOutdated.behind``), one
    this release does not know was migrated by a newer one."""
    head = head_revision()
    async with engine.connect() as conn:
        try:
            current = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
        except ProgrammingError:
            current = None
    if current == head:
        return
    if current is None or current in _revision_graph(VERSIONS)[0]:
        raise SchemaOutdated(
            f"database schema is at revision {current or 'none'}, this manager needs {head}: "
            "run `alembic upgrade head` (or `make migrate`, or the migration Job)",
            behind=True,
        )
    raise SchemaOutdated(
        f"database schema is at revision {current}, which this manager does not know (a newer release migrated "
        f"it; this one needs {head}): run a manager of that release or newer"
    )
