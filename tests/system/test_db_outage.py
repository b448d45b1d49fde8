"""PostgreSQL refuses connections or is down while services report and die: no report is
dead-lettered, the API answers 503 with Retry-After meanwhile, and the manager converges by
itself once the database is back. (Issue #11, reliability.)"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy.engine import make_url

from shared import topology
from tools import infra
from tools.harness import Proc, System, wait_for
from tools.partition import Partition

STATE_ERRORS = topology.error_queue_name(topology.STATE_QUEUE)


@contextlib.contextmanager
def refusing_connections(postgres: infra.PostgresNode, database_url: str) -> Iterator[None]:
    """The test's database accepts no new connection and its sessions are terminated (the
    server stays up: as when a database is being restored or moved)."""
    name = make_url(database_url).database
    assert name
    postgres.psql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    try:
        postgres.psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")
        yield
    finally:
        postgres.psql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


@contextlib.contextmanager
def postgres_down(postgres: infra.PostgresNode) -> Iterator[None]:
    """The whole PostgreSQL server stopped; started again on the way out, whatever happened,
    so that later tests find it running."""
    postgres.stop()
    try:
        yield
    finally:
        postgres.start()


def create_many(system: System, tmp_path: Path, count: int, prefix: str = "obs", **extra: Any) -> list[str]:
    args = {"interval_s": 0.2}
    return [system.create(f"{prefix}-{i}", args=args, **extra)["id"] for i in range(count)]


def observers_by_id(system: System) -> dict[str, dict[str, Any]]:
    return {o["id"]: o for o in system.observers()}


def started_in(proc: Proc, observer_id: str) -> bool:
    return any(f"observer {observer_id} (" in line and "started" in line for line in proc.text().splitlines())


def assert_outage_felt(manager: Proc) -> None:
    """The state side met the outage and waited (rather than the test missing it): its
    consumer, or its leader lock, whose session the outage ended (the state side then stands
    by, consuming nothing, until it holds the lock again)."""
    said = manager.text()
    assert (
        "applying state reports: the database is unavailable or busy" in said
        or "waiting to lead: the database is unavailable or busy" in said
    ), said[-4000:]


def test_reports_wait_while_the_database_refuses_connections(
    system: System, tmp_path: Path, postgres: infra.PostgresNode
) -> None:
    # Given svc-a running four observers, svc-b with room, and "x" in pool "spare" stopped
    # while no service runs it (its start waits in the queue)
    manager = system.start_manager()
    a = system.start_service("svc-a", workers=10)
    ids = create_many(system, tmp_path, 4)
    wait_for(lambda: all(o["status"] == "Processing" for o in system.observers()), 30, "Processing on svc-a")
    b = system.start_service("svc-b", workers=10)
    c = system.start_service("svc-c", workers=2, ORCH_POOLS="spare")
    x = system.create("x", pool="spare", args={"interval_s": 0.2})["id"]
    system.wait_status(x, "Processing")
    assert c.terminate() == 0
    wait_for(
        lambda: (o := system.observer(x))["status"] == "Created" and o["service_id"] is None, 30, "x with no service"
    )
    assert system.delete(f"/api/observers/{x}").status_code == 202
    old_a = system.service_by_name("svc-a")
    assert old_a is not None

    # When the database refuses connections while svc-a is killed and restarted under its
    # name and svc-c comes back and takes x: every one of these is a report to apply
    began = time.monotonic()
    with refusing_connections(postgres, system.database_url):
        a.kill9()
        new_a = system.start_service("svc-a", workers=10, wait=False)
        new_c = system.start_service("svc-c", workers=2, wait=False, ORCH_POOLS="spare")
        wait_for(lambda: all(started_in(b, i) for i in ids), 30, "the moved observers started on svc-b")
        wait_for(lambda: started_in(new_c, x), 30, "x started on the new svc-c")
        wait_for(lambda: "broker session open" in new_a.text(), 30, "the new svc-a connected")
        time.sleep(max(0.0, 10 - (time.monotonic() - began)))  # let the manager try a while

    # Then no report was dead-lettered, and the state converges once connections are allowed
    assert system.queue_counts(STATE_ERRORS)[0] == 0
    assert_outage_felt(manager)

    def converged() -> bool:
        observers = observers_by_id(system)
        svc_a = system.service_by_name("svc-a", pid=new_a.popen.pid)
        return (
            observers[x]["status"] == "Deleted"
            and all(observers[i]["status"] == "Processing" and observers[i]["service_id"] != old_a["id"] for i in ids)
            and svc_a is not None
            and system.service_by_name("svc-c", pid=new_c.popen.pid) is not None
        )

    wait_for(converged, 60, "the restarted services alive, the moved observers Processing, x Deleted")
    assert system.get(f"/api/services/{old_a['id']}").json()["status"] == "deleted"
    assert system.queue_counts(STATE_ERRORS)[0] == 0
    assert "dead-lettering" not in manager.text()


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["detail"]
    assert int(response.headers["retry-after"]) > 0


def test_postgres_down_answers_503_and_the_manager_recovers(
    system: System, tmp_path: Path, postgres: infra.PostgresNode
) -> None:
    # Given svc-a running six observers and svc-b with room
    manager = system.start_manager()
    a = system.start_service("svc-a", workers=10)
    ids = create_many(system, tmp_path, 6)
    wait_for(lambda: all(o["status"] == "Processing" for o in system.observers()), 30, "Processing on svc-a")
    b = system.start_service("svc-b", workers=10)
    old_a = system.service_by_name("svc-a")
    assert old_a is not None
    to_stop = ids[:2]

    # When PostgreSQL is down for about 20 s while svc-a is killed and stops are requested
    began = time.monotonic()
    with postgres_down(postgres):
        a.kill9()
        # Then every route that needs the database answers like a service that is down
        ready = system.get("/readyz")
        assert ready.status_code == 503 and ready.json()["database"].startswith("unreachable")
        assert_unavailable(system.post("/api/observers", {"name": "during-outage", "kind": "ticker"}))
        assert_unavailable(system.delete(f"/api/observers/{to_stop[0]}"))
        assert_unavailable(system.post("/api/observers/bulk-stop", {"ids": to_stop}))
        assert_unavailable(system.get(f"/api/observers/{ids[0]}"))
        assert_unavailable(system.get("/api/observers"))
        assert_unavailable(system.get("/api/services"))
        assert_unavailable(system.get("/api/stats"))
        wait_for(lambda: all(started_in(b, i) for i in ids), 30, "the moved observers started on svc-b")
        time.sleep(max(0.0, 20 - (time.monotonic() - began)))
    assert_outage_felt(manager)

    # And once it is back the manager reconnects by itself: the stops are accepted and end
    # Deleted, svc-a's observers run on svc-b, the counts agree, no report was lost
    wait_for(lambda: system.get("/api/observers").status_code == 200, 60, "the API to answer again")
    for oid in to_stop:
        assert system.delete(f"/api/observers/{oid}").status_code == 202
    rest = ids[2:]

    def converged() -> bool:
        observers = observers_by_id(system)
        return all(observers[i]["status"] == "Deleted" for i in to_stop) and all(
            observers[i]["status"] == "Processing" and observers[i]["service_name"] == "svc-b" for i in rest
        )

    wait_for(converged, 60, "stops Deleted and svc-a's observers Processing on svc-b")
    assert system.get("/readyz").status_code == 200
    wait_for(lambda: system.get("/api/stats").json()["observers"].get("Processing") == len(rest), 30, "stats")
    assert system.get("/api/stats").json()["observers"].get("Deleted") == len(to_stop)
    wait_for(lambda: (svc := system.service_by_name("svc-b")) and svc["running"] == len(rest), 30, "svc-b's count")
    # Heartbeats are judged again once the backlog is applied: the killed svc-a is lost
    wait_for(lambda: system.get(f"/api/services/{old_a['id']}").json()["status"] == "lost", 30, "svc-a lost")
    assert system.get("/api/observers", name="during-outage").json()["items"] == []
    assert system.queue_counts(STATE_ERRORS)[0] == 0
    assert "dead-lettering" not in manager.text()
    # and the manager's log told the outage in a line when it began and one when it ended,
    # per loop, not a line per attempt (each loop retried every second or faster). The
    # outage ended the leader lock's session: the state side stood by, its loops ended with
    # their term, and it says when it leads again.
    said = manager.text()
    assert said.count("unavailable or busy") <= 4, said[-4000:]
    stood_by = "gave up the lead" in said
    for loop in ("applying state reports", "background repairs", "waiting to lead"):
        if f"{loop}: the database is unavailable" in said and (loop == "waiting to lead" or not stood_by):
            assert f"{loop}: the database answers again after" in said, said[-4000:]
    if stood_by:
        assert said.rindex("now applies state reports") > said.rindex("gave up the lead"), said[-4000:]


def test_requests_behind_a_locked_table_are_refused_in_time_and_served_once_it_is_free(system: System) -> None:
    # Given a manager whose API gives up on PostgreSQL after 1 s, and an observer running
    system.start_manager(ORCH_API_DB_TIMEOUT_S="1")
    system.start_service("svc-a", workers=2)
    observer = system.create("locked-out")
    system.wait_status(observer["id"], "Processing")

    async def hold_lock(locked: threading.Event, release: threading.Event) -> None:
        db = await asyncpg.connect(make_url(system.database_url).set(drivername="postgresql").render_as_string(False))
        try:
            async with db.transaction():
                await db.execute("LOCK TABLE observers IN ACCESS EXCLUSIVE MODE")  # a migration, VACUUM FULL
                locked.set()
                await asyncio.to_thread(release.wait)
        finally:
            await db.close()

    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=asyncio.run, args=(hold_lock(locked, release),))
    holder.start()
    try:
        assert locked.wait(30)
        # When the table stays locked, reads, a create and a stop are refused with a 503 that
        # says to retry, well before the client's 10 s timeout (they used to wait as long as
        # the lock, or 30 s for a pooled connection)
        refused = [system.get(path) for path in (f"/api/observers/{observer['id']}", "/api/observers", "/api/stats")]
        refused += [system.post("/api/observers", {"name": "while-locked", "kind": "ticker"})]
        refused += [system.delete(f"/api/observers/{observer['id']}")]
        for response in refused:
            assert response.status_code == 503, (response.request.url, response.text)
            assert "database" in response.json()["detail"] and int(response.headers["retry-after"]) > 0
    finally:
        release.set()
        holder.join(30)
    # Once the lock is gone, the same requests are served, and the refused ones did nothing
    assert system.observer(observer["id"])["status"] == "Processing"
    assert system.get("/api/observers", name="while-locked").json()["items"] == []
    assert system.get("/api/stats").json()["services"]["alive"] == 1


def test_a_manager_started_while_its_database_refuses_connections_waits_for_it(
    system: System, postgres: infra.PostgresNode
) -> None:
    # It used to exit at once, status 3, with a traceback: a host booting, or a compose file
    # without health ordering, left no manager running once PostgreSQL was there.
    with refusing_connections(postgres, system.database_url):
        manager = system.start_manager(wait=False)
        for side in ("the API", "the state process"):
            wait_for(
                lambda side=side: f"{side}: the database is unavailable or busy" in manager.text(),  # type: ignore[misc]
                60,
                f"{side} to wait for the database",
            )
        assert manager.alive(), manager.text()[-3000:]
    wait_for(lambda: system.get("/readyz").status_code == 200, 60, "the manager to be ready")
    said = manager.text()
    assert "the API: the database answers again" in said and "the state process: the database answers again" in said
    assert "Traceback" not in said and " ERROR [" not in said, said[-3000:]
    system.start_service("svc-a", workers=2)
    system.wait_status(system.create("after-the-wait", args={"interval_s": 0.5})["id"], "Processing")


def test_a_manager_given_a_wrong_database_password_says_so_in_one_line_and_exits(system: System) -> None:
    wrong = make_url(system.database_url).set(password="not-the-password")
    manager = system.start_manager(wait=False, ORCH_DATABASE_URL=wrong.render_as_string(hide_password=False))
    assert manager.popen.wait(60) == 2
    said = manager.text()
    assert "CRITICAL [manager] manager: cannot use the database at" in said, said
    assert 'password authentication failed for user "orch"' in said and "fix ORCH_DATABASE_URL" in said, said
    assert "Traceback" not in said and "not-the-password" not in said, said


def test_a_database_cut_off_by_the_network_gets_answers_not_hangs(system: System) -> None:
    # Given a manager that reaches PostgreSQL through a network that can be cut
    with Partition.before(system.database_url) as network:
        url = network.url_for(system.database_url)
        manager = system.start_manager(ORCH_DATABASE_URL=url, ORCH_API_DB_TIMEOUT_S="2")
        system.start_service("svc-a", workers=10)
        running = system.create("before-cut")["id"]
        system.wait_status(running, "Processing")

        # When the network drops everything: PostgreSQL answers nothing, refuses nothing
        network.cut()

        # Then every route answers 503 in its own time (the client here gives up after 10 s)
        ready = system.get("/readyz")
        assert ready.status_code == 503 and ready.json()["database"].startswith("no answer within"), ready.text
        for response in (
            system.get("/api/observers"),
            system.get(f"/api/observers/{running}"),
            system.post("/api/observers", {"name": "during-cut", "kind": "ticker"}),
            system.delete(f"/api/observers/{running}"),
        ):
            assert response.status_code == 503, response.text
            assert "database" in response.json()["detail"] and int(response.headers["retry-after"]) > 0

        # And once the network is back it serves again: what was refused was not done
        network.heal()
        wait_for(lambda: system.get("/readyz").status_code == 200, 60, "ready again")
        assert system.get("/api/observers", name="during-cut").json()["items"] == []
        assert system.observer(running)["status"] == "Processing"
        after = system.create("after-cut")["id"]
        system.wait_status(after, "Processing")
        said = manager.text()
        assert "database unavailable: TimeoutError: no answer in time" in said, said[-3000:]
        assert "Traceback" not in said and " ERROR [" not in said, said[-3000:]
