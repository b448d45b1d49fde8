"""The manager's own repairs: orphans stopped, crashed creates re-published, schema check,
pagination. Real processes, real broker and database."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import time
import uuid
from pathlib import Path

import asyncpg

from shared import topology
from shared.messages import ServiceInventory, StartObserver
from tests.system.test_migrations import alembic
from tools import infra
from tools.harness import System, wait_for


def sql(database_url: str, query: str, *args: object) -> object:
    """Run ``query``; returns the first column of its first row (None if it has none)."""

    async def run() -> object:
        conn = await asyncpg.connect(database_url.replace("+asyncpg", ""))
        try:
            return await conn.fetchval(query, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


def test_an_observer_with_no_row_is_adopted_unless_its_name_is_taken(system: System, tmp_path: Path) -> None:
    system.start_manager()
    service = system.start_service("svc-a", workers=4)
    taken = system.create("taken", args={"interval_s": 0.5})
    orphan = StartObserver(observer_id=uuid.uuid4(), name="orphan", kind="ticker", args={"interval_s": 0.5})
    impostor = StartObserver(observer_id=uuid.uuid4(), name="taken", kind="ticker", args={"interval_s": 0.5})
    system.publish_raw(topology.start_queue_name("default"), orphan.encode())
    system.publish_raw(topology.start_queue_name("default"), impostor.encode())

    path = f"/api/observers/{orphan.observer_id}"
    wait_for(lambda: system.get(path).status_code == 200, 30, "the orphan adopted")
    adopted = system.wait_status(str(orphan.observer_id), "Processing")
    assert adopted["name"] == "orphan" and adopted["service_name"] == "svc-a" and adopted["args"]["interval_s"] == 0.5
    events = [e["event"] for e in system.get(f"/api/observers/{orphan.observer_id}/events").json()]
    assert events == ["adopted"]
    assert service.text().count("(ticker orphan) started") == 1  # adopted where it runs, never restarted
    wait_for(lambda: "not adopted: its name 'taken' now belongs" in service.text(), 30, "the impostor stopped")
    assert system.get(f"/api/observers/{impostor.observer_id}").status_code == 404
    assert system.observer(taken["id"])["status"] == "Processing"
    wait_for(lambda: system.queue_counts(topology.start_queue_name("default"))[0] == 0, 10, "nothing requeued")


def test_a_row_left_unenqueued_by_a_crash_is_published_again(system: System) -> None:
    # A create that crashed between its commit and its publish leaves such a row
    oid = uuid.uuid4()
    sql(
        system.database_url,
        "WITH o AS (INSERT INTO observers (id, name, kind, args, pool, status) "
        "VALUES ($1, 'crashed', 'ticker', $2::jsonb, 'default', 'Created') RETURNING id) "
        "INSERT INTO pending_starts (observer_id, created_at) SELECT id, now() - interval '1 hour' FROM o",
        oid,
        json.dumps({"interval_s": 1.0}),
    )
    system.start_manager()
    system.start_service("svc-a", workers=2)
    observer = system.wait_status(str(oid), "Processing", timeout=60)
    assert observer["service_name"] == "svc-a"


def test_the_manager_waits_for_an_unmigrated_database_and_refuses_a_newer_one(
    system: System, postgres: infra.PostgresNode, tmp_path: Path
) -> None:
    """Issue 63: on Kubernetes the migrations run as a Job beside the new managers, and a
    manager that exited on a schema behind its own was restarted again and again."""
    name = f"t_empty_{uuid.uuid4().hex[:8]}"
    postgres.create_database(name)
    try:
        empty = System(amqp_url=system.amqp_url, database_url=postgres.url(name), workdir=tmp_path)
        manager = empty.start_manager(wait=False)
        wait_for(lambda: "waiting for the database's migrations" in manager.text(), 60, "the manager to wait")
        assert manager.alive() and "alembic upgrade head" in manager.text()
        alembic(empty.database_url, "upgrade", "head")
        wait_for(lambda: empty.get("/readyz").status_code == 200, 60, "the manager ready once migrated")
        empty.stop_all()

        # A schema of a release this manager does not know: waiting will not help.
        postgres.psql("UPDATE alembic_version SET version_num = 'f00dfeed0001'", database=name)
        newer = empty.start_manager(wait=False)
        assert newer.popen.wait(60) == 2
        assert "which this manager does not know" in newer.text()
    finally:
        postgres.drop_database(name)


def test_list_filters_and_keyset_pages(system: System) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=20)
    ids = [system.create(f"page-{i:02d}", args={"interval_s": 5})["id"] for i in range(7)]
    system.create("other", kind="ticker", args={"interval_s": 5}, pool="default")

    seen: list[str] = []
    cursor = None
    while True:
        page = system.get("/api/observers", limit=3, **({"cursor": cursor} if cursor else {})).json()
        seen += [o["id"] for o in page["items"]]
        assert len(page["items"]) <= 3
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen[:7] == ids and len(seen) == 8

    by_name = system.get("/api/observers", name="page-03").json()["items"]
    assert [o["id"] for o in by_name] == [ids[3]]
    wait_for(lambda: len(system.observers(status="Processing")) == 8, 30, "all Processing")
    service = system.service_by_name("svc-a")
    assert service is not None
    assert len(system.observers(service_id=service["id"], kind="ticker", pool="default")) == 8
    assert system.get("/api/observers", limit=0).status_code == 422
    bad_cursor = system.get("/api/observers", cursor="nonsense")
    assert bad_cursor.status_code == 422 and "cursor" in bad_cursor.json()["detail"]
    assert system.get("/api/observers", status="Sleeping").status_code == 422


def test_an_inventory_larger_than_the_sql_parameter_limit_is_applied(system: System) -> None:
    # asyncpg refuses more than 32,767 parameters per statement: ids travel as one array
    system.start_manager()
    system.start_service("svc-a", workers=2)
    service = system.service_by_name("svc-a")
    assert service is not None
    created = system.create("known", args={"interval_s": 5})
    system.wait_status(created["id"], "Processing")

    ids = [uuid.UUID(created["id"])] + [uuid.uuid4() for _ in range(40_000)]
    big = ServiceInventory(service_id=uuid.UUID(service["id"]), observer_ids=ids)
    system.publish_raw(topology.STATE_QUEUE, big.encode())

    manager = system.manager
    assert manager is not None

    def described() -> int:
        # A few lines and batched requests, not 40,000 of each: a sweep that ticks while the
        # inventory is recorded takes the ids already due, the next one the rest.
        pattern = rf"(\d+) observer\(s\) run on {service['id']} but have no row"
        return sum(int(n) for n in re.findall(pattern, manager.text()))

    wait_for(lambda: described() == 40_000, 30, "the service asked to describe the unknown ids")
    assert len(re.findall(r"but have no row", manager.text())) <= 5
    assert "could not be applied" not in manager.text()
    assert system.observer(created["id"])["status"] == "Processing"


def _squat(port: int, trying_s: float) -> socket.socket | None:
    """A socket listening on ``port``, or None if it cannot be had for ``trying_s`` (the
    dead child's sockets may hold it for a moment)."""
    deadline = time.monotonic() + trying_s
    while True:
        squatter = socket.socket()
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            squatter.bind(("127.0.0.1", port))
            squatter.listen()
            return squatter
        except OSError:
            squatter.close()
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)


def _listening_port(pid: int) -> int | None:
    """The TCP port ``pid`` listens on (one socket of its own: the state process's metrics)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
            return int(fields[1].rpartition(":")[2], 16)
    return None


def _gone(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]) == "Z"
    except OSError:
        return True


def test_the_state_process_is_restarted_if_it_dies_and_dies_with_the_manager(system: System) -> None:
    manager = system.start_manager()
    system.start_service("svc-a", workers=5)
    first = wait_for(lambda: manager.state_process() or 0, 20, "the state process")
    metrics_port = wait_for(lambda: _listening_port(first) or 0, 20, "the state process's metrics socket")
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: _gone(first), 10, "the state process to die", every=0.01)
    # In the second before the restart, another process tries to take the metrics port. The
    # manager holds it (``StateSupervisor``), so it cannot; when the child bound a port the
    # manager had only picked, a port taken here failed every start of the child after it.
    squatter = _squat(metrics_port, 0.5)

    def replaced() -> int:
        pid = manager.state_process() or 0
        return pid if pid != first else 0

    second = wait_for(replaced, 20, "a new state process")
    assert "state process exited" in manager.text()

    # The new one applies state, and its counters are served through the API's /metrics.
    created = system.create("after-restart", args={"interval_s": 1})
    system.wait_status(created["id"], "Processing")
    wait_for(lambda: "orch_state_messages_applied_total" in system.get("/metrics").text, 20, "the state metrics")
    if squatter is not None:
        squatter.close()

    # A kill -9 of the manager takes its state process along (no consumer left behind).
    manager.kill9()
    wait_for(lambda: _gone(second), 10, "the state process to die with the manager")


def test_a_manager_killed_while_it_starts_takes_its_state_process_along(system: System) -> None:
    # ``python -m manager`` spawns the state process before it imports the API (so a restarted
    # manager applies its backlog sooner): a kill -9 in between must leave no consumer behind.
    manager = system.start_manager(wait=False)
    child = wait_for(lambda: manager.state_process() or 0, 20, "the state process", every=0.02)
    manager.kill9()
    wait_for(lambda: _gone(child), 10, "the state process to die with the manager")


def test_a_single_process_manager_applies_state_too(system: System) -> None:
    manager = system.start_manager(ORCH_STATE_PROCESS="false")
    system.start_service("svc-a", workers=5)
    created = system.create("one-process", args={"interval_s": 1})
    system.wait_status(created["id"], "Processing")
    assert system.delete(f"/api/observers/{created['id']}").status_code == 202
    system.wait_status(created["id"], "Deleted")
    assert manager.state_process() is None
    applied = [line for line in system.get("/metrics").text.splitlines() if line.startswith("orch_state_messages")]
    assert applied and float(applied[0].split()[-1]) > 0, applied


def test_history_older_than_the_retention_window_is_deleted(system: System) -> None:
    system.start_manager(ORCH_EVENTS_RETENTION_DAYS="30")
    system.start_service("svc-a", workers=2)
    oid = system.create("old-timer", args={"interval_s": 5})["id"]
    system.wait_status(oid, "Processing")
    # 25,000 events from 40 days ago (more than one pass deletes), older than its real ones.
    sql(
        system.database_url,
        "INSERT INTO observer_events (observer_id, at, event, detail) "
        "SELECT $1, now() - interval '40 days', 'retrying', 'old' FROM generate_series(1, 25000)",
        uuid.UUID(oid),
    )
    sql(
        system.database_url,
        "UPDATE observer_events SET id = -id WHERE detail = 'old'",  # older ids, as if appended first
    )
    old_death, recent_death = uuid.uuid4(), uuid.uuid4()
    sql(
        system.database_url,
        "INSERT INTO host_deaths (service_id, at) VALUES ($1, now() - interval '40 days'), ($2, now())",
        old_death,
        recent_death,
    )
    # A pass runs when the manager starts, then a minute later unless one found a full batch.
    assert system.manager is not None
    system.manager.kill9()
    system.start_manager(ORCH_EVENTS_RETENTION_DAYS="30")

    def old_left() -> int:
        events = system.get(f"/api/observers/{oid}/events", limit=1000).json()
        return sum(1 for e in events if e["detail"] == "old")

    wait_for(lambda: old_left() == 0, 60, "the old history deleted")
    deaths = sql(system.database_url, "SELECT array_agg(service_id) FROM host_deaths")
    assert deaths == [recent_death]
    assert [e["event"] for e in system.get(f"/api/observers/{oid}/events").json()] == ["created", "started"]
