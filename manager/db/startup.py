"""The manager's first contact with its database: wait while it cannot be reached, refuse at
once, in one line, what waiting cannot fix.

A manager started before its PostgreSQL (a host booting, `docker compose up` without health
ordering, an outage under way) waits for it, as for the broker, saying so as every loop says
an outage (``shared.outage``: once when it begins, once a minute, once when it ends), and carries
on once the database answers; a schema behind its own is waited for the same way, until a
migration brings it to the head (a Job may be running it). What waiting cannot fix (a wrong
password, a database or role that does not exist, a certificate refused either way, a schema
a newer release migrated) is one CRITICAL line naming the setting to fix, and the process
exits with status 2, as for a metrics port that is taken. Both sides call it: the API process
before it serves (``manager/__main__.py``), the state process before it applies anything
(``manager/state_side.py``).
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from manager.db.engine import SchemaOutdated, check_schema, make_engine
from manager.db.errors import DATABASE_ERRORS, database_outage, database_tls_refusal, describe, is_transient
from manager.settings import ManagerSettings
from shared.outage import OutageLog

_RETRY_S = 1.0


class DatabaseRefused(RuntimeError):
    """The database answered, and what it said will not change by waiting."""


async def wait_for_schema(engine: AsyncEngine, what: str, log: logging.Logger) -> None:
    """``check_schema``, waiting while the database cannot be reached or is busy, and while its
    schema is behind this manager's (a migration Job may be running; on Kubernetes an exit
    would only restart the pod, again and again). Raises ``DatabaseRefused`` for a
    deterministic refusal, ``SchemaOutdated`` for a schema this manager does not know."""
    outage = database_outage(what, log)
    migrations = OutageLog(log, f"{what}: waiting for the database's migrations", f"{what}: the schema is up to date")
    while True:
        try:
            await check_schema(engine)
        except SchemaOutdated as e:
            if not e.behind:
                raise
            outage.worked()
            migrations.failed(str(e))
            await asyncio.sleep(_RETRY_S)
            continue
        except DATABASE_ERRORS as e:
            url = make_url(engine.url).render_as_string(hide_password=True)
            tls = database_tls_refusal(e)
            if tls is not None:
                raise DatabaseRefused(f"cannot use the database at {url}: {tls}") from e
            if not is_transient(e):
                raise DatabaseRefused(
                    f"cannot use the database at {url} ({describe(e)}): fix ORCH_DATABASE_URL "
                    "(user, password, database name) or the database's roles"
                ) from e
            outage.failed(describe(e))
            await asyncio.sleep(_RETRY_S)
            continue
        outage.worked()
        migrations.worked()
        return


def database_ready_or_exit(settings: ManagerSettings, what: str, log: logging.Logger) -> None:
    """``wait_for_schema`` on an engine of its own, before an event loop runs; a refusal is
    one CRITICAL line and ``SystemExit(2)``."""

    async def check() -> None:
        engine = make_engine(settings.database_url, tls=settings.database_tls_context())
        try:
            await wait_for_schema(engine, what, log)
        finally:
            await engine.dispose()

    try:
        asyncio.run(check())
    except (DatabaseRefused, SchemaOutdated) as e:
        log.critical("%s", e)
        raise SystemExit(2) from None
