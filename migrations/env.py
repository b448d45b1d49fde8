"""Alembic environment (async, after Alembic's ``async`` template).

The database URL comes from ``ORCH_DATABASE_URL`` like everywhere else.
"""

from __future__ import annotations

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from manager.db.models import Base
from manager.settings import ManagerSettings

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or ManagerSettings().database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


# Two `alembic upgrade head` at once (two Jobs, a Job and an operator) take turns: the second
# waits until the first is done, then finds the schema at the head and does nothing. A lock of
# the session, taken before alembic reads the current revision and held to the end: some
# migrations commit half-way (``autocommit_block``, for CREATE INDEX CONCURRENTLY), which
# would end a lock of the transaction there.
# The two-key form in the leader lock's namespace, "orch" (``manager/db/leader.py``).
_MIGRATION_LOCK = {"a": 0x6F726368, "b": 2}


def _do_run(connection: Connection) -> None:
    connection.execute(text("SELECT pg_advisory_lock(:a, :b)"), _MIGRATION_LOCK)
    connection.commit()  # the lock stays with the session; alembic begins its own transaction
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
    connection.execute(text("SELECT pg_advisory_unlock(:a, :b)"), _MIGRATION_LOCK)
    connection.commit()


async def run_migrations_online() -> None:
    # The manager's own TLS (``ORCH_DATABASE_TLS``, ``ORCH_DATABASE_CA_FILE``...): verified.
    tls = ManagerSettings().database_tls_context()
    engine = create_async_engine(_url(), connect_args={"ssl": tls} if tls is not None else {})
    async with engine.connect() as connection:
        await connection.run_sync(_do_run)
    await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_migrations_online())
