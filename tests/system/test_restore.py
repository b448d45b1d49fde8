"""An older database restored under a running fleet, then the broker's data lost (issue 62,
item 11, as it was reported): the observers the backup forgot are adopted where they run, the
rebuild lands everything on one service, the balancer hands most of it over, and creates and
stops go on meanwhile; each observer runs on one service at a time."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.system.test_balance import creates_and_stops_meanwhile
from tests.system.test_fencing import assert_never_on_two_services
from tools import infra
from tools.harness import System, probe_args, read_ticks, wait_for


def create_probes(system: System, log: Path, prefix: str, count: int) -> list[str]:
    specs = [{"name": f"{prefix}-{i}", "kind": "probe", "args": probe_args(log, interval_s=1.0)} for i in range(count)]
    response = system.post("/api/observers/bulk", {"observers": specs})
    assert response.status_code == 201, response.text
    return [o["id"] for o in response.json()["items"]]


def running(system: System) -> int:
    """Observers the alive services say they run (their own inventory, not the rows)."""
    return sum(s["running"] for s in system.services() if s["status"] == "alive")


def stop_manager(system: System) -> None:
    assert system.manager is not None
    system.manager.signal(signal.SIGTERM)
    system.manager.popen.wait(30)


def test_an_older_database_restored_then_the_broker_wiped(
    with_test_plugin: System, postgres: infra.PostgresNode, rabbit: infra.RabbitNode, vhost: str, tmp_path: Path
) -> None:
    system = with_test_plugin
    system.env["ORCH_BALANCE_MOVES_PER_S"] = "250"
    database = system.database_url.rsplit("/", 1)[1]
    backup = f"{database}_backup"
    log = tmp_path / "ticks.log"
    system.start_manager()
    procs = {name: system.start_service(name, workers=300) for name in ("s1", "s2", "s3")}
    known = create_probes(system, log, "known", 100)
    wait_for(lambda: all(o["status"] == "Processing" for o in system.observers()), 60, "100 Processing")

    # The backup: a copy of the database made while the manager was briefly down.
    stop_manager(system)
    postgres.create_database(backup, template=database)
    system.start_manager()
    try:
        later = create_probes(system, log, "later", 110)
        wait_for(lambda: running(system) == 210, 60, "210 running")
        # The restore under the running manager (its sessions are cut, the leader lock's too):
        # the 110 it does not know are adopted where they run.
        postgres.drop_database(database)  # WITH (FORCE)
        postgres.create_database(database, template=backup)
    finally:
        postgres.drop_database(backup)
    wait_for(lambda: len(system.observers(status="Processing")) == 210, 60, "the 110 later ones adopted")

    # Then the broker loses its data while two services are frozen: the rebuild puts all 210
    # on s1, and the balancer hands two thirds over once the others are back.
    for name in ("s2", "s3"):
        procs[name].signal(signal.SIGSTOP)
    rabbit.delete_vhost(vhost)
    rabbit.add_vhost(vhost)
    wiped = time.time()
    wait_for(lambda: (system.service_by_name("s1") or {}).get("running") == 210, 60, "all 210 on s1 after the rebuild")
    for name in ("s2", "s3"):
        procs[name].signal(signal.SIGCONT)

    # Creates and stops during the hand-over, half of the stops of adopted observers.
    stopped = known[:10] + later[:10]
    created = creates_and_stops_meanwhile(system, {"kind": "probe", "args": probe_args(log, interval_s=1.0)}, stopped)
    kept = sorted(set(known + later) - set(stopped))
    wait_for(lambda: all(system.observer(oid)["status"] == "Processing" for oid in kept), 60, "the others running")
    expected = len(kept) + len(created)
    wait_for(lambda: running(system) == expected, 60, f"{expected} running")
    print(f"every create and stop applied {time.time() - wiped:.1f}s after the broker lost its data")

    time.sleep(3)  # a few ticks of everyone where it runs now
    settled = time.time() - 2
    ticking = {oid for oid, _, _, at in read_ticks(log) if at > settled}
    assert not ticking & set(stopped), "a stopped observer still runs"
    assert set(kept) | set(created) <= ticking
    assert_never_on_two_services(log)
