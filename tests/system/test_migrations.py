"""Migrations that carry data: run against a real PostgreSQL from the revision before."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from manager.db.engine import SchemaOutdated, head_revision
from shared.messages import digest_of, digest_text
from tools import infra
from tools.harness import REPO


def alembic(url: str, *args: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "ORCH_DATABASE_URL": url}
    subprocess.run([sys.executable, "-m", "alembic", *args], cwd=REPO, env=env, check=True, timeout=120)


def test_0007_counts_the_service_deaths_already_in_the_history(postgres: infra.PostgresNode) -> None:
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


def test_0008_keeps_the_digests_of_what_is_held_already(postgres: infra.PostgresNode) -> None:
    """Rows held before the upgrade are in the kept digests after it: a service's next digest
    must match without a full inventory."""
    name = f"t_mig_{uuid.uuid4().hex[:8]}"
    postgres.create_database(name)
    url = postgres.url(name)
    svc_a, svc_b, session_a, session_b = (uuid.uuid4() for _ in range(4))
    held = {(svc_a, session_a): [uuid.uuid4() for _ in range(5)], (svc_b, session_b): [uuid.uuid4() for _ in range(3)]}
    try:
        alembic(url, "upgrade", "0007")

        async def fill() -> None:
            conn = await asyncpg.connect(url.replace("+asyncpg", ""))
            try:
                for service_id in (svc_a, svc_b):
                    await conn.execute(
                        "INSERT INTO services (id, name, workers_count, status) VALUES ($1, 'svc', 5, 'alive')",
                        service_id,
                    )
                rows: list[tuple[uuid.UUID, str, uuid.UUID | None, uuid.UUID | None]] = [
                    (oid, "OnDeleting" if i == 0 else "Processing", sid, ses)
                    for (sid, ses), ids in held.items()
                    for i, oid in enumerate(ids)
                ]
                rows += [(uuid.uuid4(), "Created", None, None), (uuid.uuid4(), "Deleted", svc_a, session_a)]
                for i, (oid, status, sid, ses) in enumerate(rows):
                    await conn.execute(
                        "INSERT INTO observers (id, name, kind, args, pool, status, service_id, host_session_id) "
                        "VALUES ($1, $2, 'ticker', '{}', 'default', $3, $4, $5)",
                        oid,
                        f"o{i}",
                        status,
                        sid,
                        ses,
                    )
            finally:
                await conn.close()

        async def read() -> dict[tuple[uuid.UUID, uuid.UUID], tuple[int, str]]:
            conn = await asyncpg.connect(url.replace("+asyncpg", ""))
            try:
                rows = await conn.fetch("SELECT service_id, host_session_id, n, xor_hi, xor_lo FROM held_digests")
                mask = (1 << 64) - 1
                return {
                    (r["service_id"], r["host_session_id"]): (
                        r["n"],
                        digest_text(((r["xor_hi"] & mask) << 64) | (r["xor_lo"] & mask)),
                    )
                    for r in rows
                }
            finally:
                await conn.close()

        asyncio.run(fill())
        alembic(url, "upgrade", "head")
        assert asyncio.run(read()) == {holder: (len(ids), digest_of(ids)) for holder, ids in held.items()}
        alembic(url, "downgrade", "0007")
        alembic(url, "upgrade", "head")
    finally:
        postgres.drop_database(name)


def test_0010_lets_a_service_be_unknown_and_its_downgrade_forgets_such_services(postgres: infra.PostgresNode) -> None:
    """Without the key an observer may name a service the services table lost (a restore from
    an older backup: the rules put it back on its service when that introduces itself); putting the
    key back forgets those services instead of failing, and keeps the known ones."""
    name = f"t_mig_{uuid.uuid4().hex[:8]}"
    postgres.create_database(name)
    url = postgres.url(name)
    known, gone = uuid.uuid4(), uuid.uuid4()
    kept, orphan = uuid.uuid4(), uuid.uuid4()
    try:
        alembic(url, "upgrade", "head")

        async def fill() -> None:
            conn = await asyncpg.connect(url.replace("+asyncpg", ""))
            try:
                await conn.execute(
                    "INSERT INTO services (id, name, workers_count, status, last_heartbeat_at) "
                    "VALUES ($1, 'svc', 10, 'alive', now())",
                    known,
                )
                for i, (oid, service) in enumerate(((kept, known), (orphan, gone))):
                    await conn.execute(
                        "INSERT INTO observers (id, name, kind, args, pool, status, service_id, host_session_id) "
                        "VALUES ($1, $2, 'ticker', '{}', 'default', 'Processing', $3, $4)",
                        oid,
                        f"o{i}",
                        service,
                        uuid.uuid4(),
                    )
            finally:
                await conn.close()

        async def service_of() -> dict[uuid.UUID, tuple[uuid.UUID | None, bool]]:
            conn = await asyncpg.connect(url.replace("+asyncpg", ""))
            try:
                rows = await conn.fetch("SELECT id, service_id, host_session_id FROM observers")
                return {r["id"]: (r["service_id"], r["host_session_id"] is not None) for r in rows}
            finally:
                await conn.close()

        asyncio.run(fill())  # the orphan's insert fails while the key exists
        alembic(url, "downgrade", "0009")
        assert asyncio.run(service_of()) == {kept: (known, True), orphan: (None, False)}
        alembic(url, "upgrade", "head")
    finally:
        postgres.drop_database(name)


def test_0011_mirrors_the_services_already_set_and_its_downgrade_indexes_them_again(
    postgres: infra.PostgresNode,
) -> None:
    """Rows on a service before the upgrade are in ``observer_hosts`` after it (queries by service find
    them); the downgrade puts the index on ``observers.service_id`` back."""
    name = f"t_mig_{uuid.uuid4().hex[:8]}"
    postgres.create_database(name)
    url = postgres.url(name)
    service = uuid.uuid4()
    placed, unplaced = uuid.uuid4(), uuid.uuid4()

    async def run(*statements: tuple[str, tuple[object, ...]]) -> list[list[asyncpg.Record]]:
        conn = await asyncpg.connect(url.replace("+asyncpg", ""))
        try:
            return [await conn.fetch(sql, *args) for sql, args in statements]
        finally:
            await conn.close()

    try:
        alembic(url, "upgrade", "0010")
        insert = (
            "INSERT INTO observers (id, name, kind, args, pool, status, service_id) "
            "VALUES ($1, $2, 'ticker', '{}', 'default', $3, $4)"
        )
        asyncio.run(run((insert, (placed, "o1", "Processing", service)), (insert, (unplaced, "o2", "Created", None))))
        alembic(url, "upgrade", "head")
        (mirror,) = asyncio.run(run(("SELECT observer_id, service_id FROM observer_hosts", ())))
        assert [(r["observer_id"], r["service_id"]) for r in mirror] == [(placed, service)]
        alembic(url, "downgrade", "0010")
        indexes, tables = asyncio.run(
            run(
                ("SELECT indexname FROM pg_indexes WHERE tablename = 'observers'", ()),
                ("SELECT 1 FROM pg_tables WHERE tablename = 'observer_hosts'", ()),
            )
        )
        assert "ix_observers_service" in {r["indexname"] for r in indexes} and not tables
        alembic(url, "upgrade", "head")
    finally:
        postgres.drop_database(name)


def test_the_head_the_manager_checks_for_is_alembics() -> None:
    """``head_revision`` reads the migration files without alembic (it is imported at every
    manager start): it must name the head alembic upgrades to."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(REPO / "migrations"))
    assert head_revision() == ScriptDirectory.from_config(config).get_current_head()


def test_migrations_with_two_heads_are_refused(tmp_path: Path) -> None:
    for revision, down in (("a", None), ("b", "a"), ("c", "a"), ("d", ("b", "c"))):
        (tmp_path / f"{revision}.py").write_text(f"revision: str = {revision!r}\ndown_revision = {down!r}\n")
    assert head_revision(tmp_path) == "d"  # a merge revision joins the two branches
    (tmp_path / "d.py").unlink()
    with pytest.raises(SchemaOutdated, match=r"2 heads \(\['b', 'c'\]\)"):
        head_revision(tmp_path)


def test_0016_adds_scheduled_and_its_downgrade_refuses_while_a_row_is_scheduled(postgres: infra.PostgresNode) -> None:
    """The new enum value is usable right after the upgrade (it was committed before the
    indexes that name it); the downgrade keeps no Scheduled row behind, and the upgrade runs
    again over the value PostgreSQL cannot drop."""
    name = f"t_mig_{uuid.uuid4().hex[:8]}"
    postgres.create_database(name)
    url = postgres.url(name)

    async def sql(statement: str) -> None:
        conn = await asyncpg.connect(url.replace("+asyncpg", ""))
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    try:
        alembic(url, "upgrade", "head")
        asyncio.run(
            sql(
                "INSERT INTO observers (id, name, kind, pool, status, start_at) "
                "VALUES (gen_random_uuid(), 'later', 'ticker', 'default', 'Scheduled', now() + interval '1 hour')"
            )
        )
        with pytest.raises(subprocess.CalledProcessError):
            alembic(url, "downgrade", "0015")
        asyncio.run(sql("DELETE FROM observers"))
        alembic(url, "downgrade", "0015")
        alembic(url, "upgrade", "head")
    finally:
        postgres.drop_database(name)


def test_two_upgrades_at_once_take_turns(postgres: infra.PostgresNode) -> None:
    """Two `alembic upgrade head` on one empty database at once (two Jobs, or a Job and an
    operator): the second waits for the first's commit and finds nothing to do."""
    name = f"t_mig_{uuid.uuid4().hex[:8]}"
    postgres.create_database(name)
    try:
        env = {"PATH": "/usr/bin:/bin", "ORCH_DATABASE_URL": postgres.url(name)}
        runs = [
            subprocess.Popen(
                [sys.executable, "-m", "alembic", "upgrade", "head"],
                cwd=REPO,
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        errors = [run.communicate(timeout=120)[1] for run in runs]
        assert [run.returncode for run in runs] == [0, 0], errors
        assert postgres.psql("SELECT version_num FROM alembic_version", database=name).strip() == head_revision()
    finally:
        postgres.drop_database(name)
