"""Services die, restart and leave; the manager stays right. (Issue #2 tests 5-8 and 11.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared import topology
from tools.harness import System, probe_args, read_ticks, wait_for

# Observers are the test plug-in's probes: each tick leaves a line naming its service.
pytestmark = pytest.mark.usefixtures("with_test_plugin")


def create_many(system: System, tmp_path: Path, count: int, prefix: str = "obs") -> list[str]:
    args = probe_args(tmp_path / "ticks.log")
    return [system.create(f"{prefix}-{i}", kind="probe", args=args)["id"] for i in range(count)]


def service_names(system: System) -> dict[str, str | None]:
    return {o["id"]: o["service_name"] for o in system.observers(status="Processing")}


def all_processing(system: System, ids: list[str], exclude_service: str | None = None) -> dict[str, Any]:
    """The observers by id when all of ``ids`` are Processing (not on ``exclude_service``),
    else an empty dict."""
    observers = {o["id"]: o for o in system.observers()}
    ok = all(
        observers[i]["status"] == "Processing" and observers[i]["service_id"] not in (None, exclude_service)
        for i in ids
    )
    return observers if ok else {}


def test_kill_9_moves_observers_to_survivors(system: System, tmp_path: Path) -> None:
    system.start_manager()
    victim = system.start_service("svc-a", workers=6)
    ids = create_many(system, tmp_path, 6)
    wait_for(lambda: all_processing(system, ids), 30, "all Processing on svc-a")
    system.start_service("svc-b", workers=4)
    system.start_service("svc-c", workers=4)
    dead = system.service_by_name("svc-a")
    assert dead is not None

    victim.kill9()

    observers = wait_for(lambda: all_processing(system, ids, exclude_service=dead["id"]), 30, "failover")
    assert {o["service_name"] for o in observers.values()} <= {"svc-b", "svc-c"}
    wait_for(lambda: system.get(f"/api/services/{dead['id']}").json()["status"] == "lost", 30, "svc-a lost")
    # The bodies run again on the survivors
    survivors = {o["service_id"] for o in observers.values()}
    wait_for(lambda: survivors <= {t[1] for t in read_ticks(tmp_path / "ticks.log")}, 15, "ticks on survivors")


def test_restart_with_the_same_name_deletes_the_old_instance(system: System, tmp_path: Path) -> None:
    system.start_manager()
    first = system.start_service("svc-a", workers=4)
    ids = create_many(system, tmp_path, 3)
    wait_for(lambda: all_processing(system, ids), 30, "Processing")
    old = system.service_by_name("svc-a")
    assert old is not None

    first.kill9()
    system.start_service("svc-a", workers=4)

    wait_for(lambda: system.get(f"/api/services/{old['id']}").json()["status"] == "deleted", 30, "old deleted")
    new = system.service_by_name("svc-a")
    assert new is not None and new["id"] != old["id"]
    observers = wait_for(lambda: all_processing(system, ids), 30, "Processing on the new instance")
    assert {o["service_id"] for o in observers.values()} == {new["id"]}


def test_sigterm_hands_observers_over(system: System, tmp_path: Path) -> None:
    system.start_manager()
    leaving = system.start_service("svc-a", workers=5)
    ids = create_many(system, tmp_path, 4)
    wait_for(lambda: all_processing(system, ids), 30, "Processing on svc-a")
    system.start_service("svc-b", workers=5)
    old = system.service_by_name("svc-a")
    assert old is not None

    assert leaving.terminate() == 0

    observers = wait_for(lambda: all_processing(system, ids, exclude_service=old["id"]), 30, "handoff")
    assert {o["service_name"] for o in observers.values()} == {"svc-b"}
    # ServiceStopped was recorded: the instance is deleted at once, not merely lost
    wait_for(lambda: system.get(f"/api/services/{old['id']}").json()["status"] == "deleted", 10, "deleted")
    assert "handing 4 observer(s) over" in leaving.text()


def test_manager_down_while_observers_move_catches_up(system: System, tmp_path: Path) -> None:
    manager = system.start_manager()
    a = system.start_service("svc-a", workers=5)
    system.start_service("svc-b", workers=5)
    system.start_service("svc-c", workers=5)
    ids = create_many(system, tmp_path, 8)
    wait_for(lambda: all_processing(system, ids), 30, "Processing")
    dead = system.service_by_name("svc-a")
    assert dead is not None

    # While the manager is down a service dies and its observers move
    manager.kill9()
    a.kill9()
    system.start_service("svc-d", workers=5, wait=False)
    wait_for(lambda: "broker session open" in system.procs[-1].text(), 30, "svc-d connected")

    # Then the restarted manager reaches the truth from the state backlog
    system.start_manager()
    observers = wait_for(lambda: all_processing(system, ids, exclude_service=dead["id"]), 30, "consistent")
    names = {s["name"]: s for s in system.services()}
    assert names["svc-d"]["status"] == "alive"
    wait_for(lambda: system.get(f"/api/services/{dead['id']}").json()["status"] == "lost", 30, "svc-a lost")
    running = sum(s["running"] for s in system.services() if s["status"] == "alive")
    assert running == len(ids) == len(observers)


def test_stop_during_redistribution_ends_deleted(system: System, tmp_path: Path) -> None:
    # Given svc-b full with a blocker, and the observer on svc-a
    system.start_manager()
    system.start_service("svc-b", workers=1)
    blocker = system.create("blocker", args={"interval_s": 1})
    assert system.wait_status(blocker["id"], "Processing")["service_name"] == "svc-b"
    a = system.start_service("svc-a", workers=2)
    moving = system.create("moving", kind="probe", args=probe_args(tmp_path / "ticks.log"))
    assert system.wait_status(moving["id"], "Processing")["service_name"] == "svc-a"

    # When svc-a dies, the observer waits in the queue, and a stop is sent meanwhile
    a.kill9()
    wait_for(lambda: system.queue_counts(topology.start_queue_name("default"))[0] >= 1, 30, "start requeued")
    assert system.delete(f"/api/observers/{moving['id']}").status_code == 202

    # Then once a slot frees up the observer is taken and stopped: Deleted, start acked
    system.delete(f"/api/observers/{blocker['id']}")
    system.wait_status(moving["id"], "Deleted", timeout=30)
    wait_for(lambda: system.queue_counts(topology.start_queue_name("default"))[0] == 0, 10, "queue empty")
