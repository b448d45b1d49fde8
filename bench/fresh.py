"""What every benchmark run starts from: a vhost and a database of its own, migrated, and
the harness's ``System`` on them; idle observers created in bulk; which service to kill for
a failover; and the cheap check the benchmarks poll while they wait."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import asyncpg
import httpx

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


async def create_idle(base_url: str, count: int, prefix: str, bulk: int = 1000) -> None:
    """``count`` idle observers named ``<prefix><i>``, in bulk requests of ``bulk``, eight at
    a time."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        gate = asyncio.Semaphore(8)

        async def send(start: int) -> None:
            body = {"observers": [{"name": f"{prefix}{i}", "kind": "idle"} for i in range(start, start + bulk)]}
            async with gate:
                (await http.post("/api/observers/bulk", json=body)).raise_for_status()

        await asyncio.gather(*(send(start) for start in range(0, count, bulk)))


async def busiest_host(db: asyncpg.Connection) -> asyncpg.Record:
    """The service running the most observers: (service_id, pid, n)."""
    row = await db.fetchrow(
        "SELECT o.service_id, s.pid, count(*) AS n FROM observers o JOIN services s ON s.id = o.service_id "
        "WHERE o.status = 'Processing' GROUP BY o.service_id, s.pid ORDER BY n DESC LIMIT 1"
    )
    assert row is not None, "no observer is Processing"
    return row


# The observers on the service given as $1, through the services' index (``manager.db.service_observers``):
# ``observers.service_id`` has none.
ON_HOST = "id IN (SELECT observer_id FROM observer_hosts WHERE service_id = $1)"

# How many observers the rows say the service $1 holds (Processing or OnDeleting, in any of
# its sessions), from the counts the manager's triggers keep (``manager/db/digests.py``):
# a poll reads a row or two. Polled through ``ON_HOST``, the last poll of a failover walked
# an index entry of every row moved away (10,002 rows, 163 ms inside the failover's clock;
# PostgreSQL's statement log), a third of a million at 1,000,000.
_HELD_BY = (
    "SELECT coalesce(sum(n), 0) FROM (SELECT n FROM held_digests WHERE service_id = $1 "
    "UNION ALL SELECT n FROM held_digest_deltas WHERE service_id = $1) AS held"
)


async def held_by(db: asyncpg.Connection, service_id: Any) -> int:
    return int(await db.fetchval(_HELD_BY, service_id))


async def any_observer(db: asyncpg.Connection, where: str, *args: Any) -> bool:
    """Whether an observer matches ``where``. The benchmarks' polls ask this, and count only
    once nothing is left to wait for, because they share the 2 cores with what they measure:
    PostgreSQL's statement log of one ``make bench`` failover had 30 polls counting the
    killed host's Processing rows take 340 ms of the 1,107 ms PostgreSQL worked in those
    2 s, and counting a third of a million rows ten times a second took a third of a core
    at 1,000,000 (top).

    Bitmap scans are off for the query: right after a bulk create the table has no
    statistics yet, and the planner ANDs two bitmaps (the host's rows, every Processing
    row), which read everything and cannot stop at the first match: 2.5-3.5 ms a poll
    instead of 0.06 ms for an index scan that stops (EXPLAIN ANALYZE mid-failover). A host's
    rows are polled with ``held_by``: through ``ON_HOST`` a poll took 35 to 80 ms, and with
    sequential scans also off here, broker-loss's poll by name took 120 ms instead of a few
    (PostgreSQL's statement log)."""
    async with db.transaction():
        await db.execute("SET LOCAL enable_bitmapscan = off")
        return bool(await db.fetchval(f"SELECT EXISTS (SELECT FROM observers WHERE {where})", *args))
