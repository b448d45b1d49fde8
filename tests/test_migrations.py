"""Migrations that carry data: run against a real PostgreSQL from the revision before."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from tools import infra
from tools.harness import REPO


def alembic(url: str, *args: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "ORCH_DATABASE_URL": url}
    subprocess.run([sys.executable, "-m", "alembic", *args], cwd=REPO, env=env, check=True, timeout=120)


def test_0007_counts_the_host_deaths_already_in_the_history(postgres: infra.PostgresNode) -> None:
    """Deaths recorded before the upgrade still bound the probation window after it: one
    ``host_deaths`` row per death (a dead service and the instant its victims share)."""
    name = f"t_mig_{uuid.uuid4().hex[:8]}"
    postgres.create_database(name)
    url = postgres.url(name)
    dead_twice, dead_once, mover = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    first, second = datetime.now(UTC) - timedelta(minutes=5), datetime.now(UTC) - timedelta(minutes=1)
    try:
        alembic(url, "upgrade", "0006")

        async def fill() -> None:
            conn = await asyncpg.connect(url.replace("+asyncpg", ""))
            try:
                ids = [uuid.uuid4() for _ in range(3)]
                for i, oid in enumerate(ids):
                    await conn.execute(
                        "INSERT INTO observers (id, name, kind, args, pool, status) "
                        "VALUES ($1, $2, 'ticker', '{}', 'default', 'Processing')",
                        oid,
                        f"o{i}",
                    )
                events = [(oid, "host_lost", dead_twice, first) for oid in ids]
                events += [(oid, "host_lost", dead_twice, second) for oid in ids[:2]]  # it came back, died again
                events += [(ids[2], "host_lost", dead_once, second), (ids[0], "moved", mover, second)]
                await conn.executemany(
                    "INSERT INTO observer_events (observer_id, event, service_id, at) VALUES ($1, $2, $3, $4)", events
                )
            finally:
                await conn.close()

        async def read() -> list[tuple[uuid.UUID, datetime]]:
            conn = await asyncpg.connect(url.replace("+asyncpg", ""))
            try:
                rows = await conn.fetch("SELECT service_id, at FROM host_deaths")
                return sorted((r["service_id"], r["at"]) for r in rows)
            finally:
                await conn.close()

        asyncio.run(fill())
        alembic(url, "upgrade", "head")
        deaths = asyncio.run(read())
        assert deaths == sorted([(dead_twice, first), (dead_twice, second), (dead_once, second)])
        alembic(url, "downgrade", "0006")
        alembic(url, "upgrade", "head")
    finally:
        postgres.drop_database(name)
