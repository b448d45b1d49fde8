"""What every benchmark run starts from: a vhost and a database of its own, migrated, and
the harness's ``System`` on them; and which service to kill for a failover."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import asyncpg

from tools import infra
from tools.harness import System


def fresh_system(rabbit: infra.RabbitNode, postgres: infra.PostgresNode, tag: str, prefix: str) -> System:
    """A new vhost and database named ``tag``, the schema migrated; logs under a new folder."""
    rabbit.add_vhost(tag)
    postgres.create_database(tag)
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    system = System(amqp_url=rabbit.url_for(tag), database_url=postgres.url(tag), workdir=workdir)
    subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        env={"PATH": "/usr/bin:/bin", "ORCH_DATABASE_URL": system.database_url},
        check=True,
        capture_output=True,
    )
    return system


async def busiest_host(db: asyncpg.Connection) -> asyncpg.Record:
    """The service running the most observers: (service_id, pid, n)."""
    row = await db.fetchrow(
        "SELECT o.service_id, s.pid, count(*) AS n FROM observers o JOIN services s ON s.id = o.service_id "
        "WHERE o.status = 'Processing' GROUP BY o.service_id, s.pid ORDER BY n DESC LIMIT 1"
    )
    assert row is not None, "no observer is Processing"
    return row
