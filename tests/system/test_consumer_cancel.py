"""A consumer the broker cancels is fenced and consumes again (issue 53).

The broker cancels a consumer (``basic.cancel``) when its queue is deleted, when the queue's
node goes down (a classic queue in a cluster) or when a quorum queue's consumer timeout
fires. What that consumer held is no longer the service's to run: the broker has handed it
to another service, or lost it with the queue. aiormq only logs the cancel, so a service that
did not watch for it ran those observers on, and never consumed again. Here the start queue
is deleted under 50 observers on 3 services (the test plug-in's ``probe``, whose ticks show
which service acted when): every service must fence and consume again, and since the starts
went with the queue, each service says which ones it held (``StartsGone``) and the manager
publishes them again at once, not after the lost-start repair's minute (issue 62, item 10:
131 s were seen). A service that consumes nothing (cordoned by a drain) gets no cancel, and
must notice the deletion all the same (item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.system.test_fencing import assert_never_on_two_services
from tools import infra
from tools.harness import System, probe_args, wait_for

pytestmark = pytest.mark.usefixtures("with_test_plugin")

SERVICES = ("svc-a", "svc-b", "svc-c")
CANCELLED = "the broker cancelled the consumer of orch.start.default"


def test_a_deleted_start_queue_fences_its_observers_and_every_service_consumes_again(
    system: System, tmp_path: Path, rabbit: infra.RabbitNode, vhost: str
) -> None:
    system.start_manager()  # the lost-start repair at its default minute: it must not be needed
    services = [system.start_service(name, workers=60) for name in SERVICES]
    log = tmp_path / "ticks.log"
    ids = [system.create(f"c-{i}", kind="probe", args=probe_args(log, 0.1))["id"] for i in range(50)]
    for oid in ids:
        system.wait_status(oid, "Processing")
    services_before = {system.observer(oid)["service_id"] for oid in ids}
    assert len(services_before) > 1, "the 50 should be spread over the services"

    rabbit.ctl("delete_queue", "-p", vhost, "orch.start.default")

    # Every service consumed the queue, so every one says why it fenced what it ran
    wait_for(lambda: all(CANCELLED in p.text() for p in services), 30, "every service to notice the cancel")
    wait_for(lambda: all(system.observer(i)["status"] == "Processing" for i in ids), 30, "all 50 running again")
    assert_never_on_two_services(log)
    # Each service said which starts went (``StartsGone``): none waited for the lost-start
    # repair. On a quorum queue that takes the marker: the cancel comes before the record goes.
    for oid in ids:
        released = [e for e in system.get(f"/api/observers/{oid}/events").json() if e["event"] == "released"]
        assert released and "deleted start queue of pool default: published again" in released[-1]["detail"], released

    # Every service consumes again: 150 observers need all three services' 60 workers. (Which
    # service a given create reaches is the balancer's priorities' choice, not this test's.)
    more = [system.create(f"m-{i}", kind="probe", args=probe_args(log, 1.0))["id"] for i in range(100)]
    for oid in more:
        system.wait_status(oid, "Processing")
    running_on = {system.observer(oid)["service_id"] for oid in ids + more}
    alive = {system.service_by_name(name)["id"] for name in SERVICES}  # type: ignore[index]
    assert running_on == alive, (running_on, alive)
    assert "Traceback" not in system.logs()


def test_a_deleted_state_queue_is_consumed_again_by_the_manager(
    system: System, rabbit: infra.RabbitNode, vhost: str
) -> None:
    # The manager's state consumer cancelled: aio-pika's robust channel (10.2) consumes
    # again by itself; were it not to, every observer created afterwards would stay Created.
    system.start_manager()
    system.start_service("svc-a", workers=10)
    first = system.create("before", args={"interval_s": 0.5})
    system.wait_status(first["id"], "Processing")

    rabbit.ctl("delete_queue", "-p", vhost, "orch.state")
    assert system.manager is not None
    manager = system.manager
    wait_for(lambda: "cancelled by the broker" in manager.text(), 30, "the manager to hear the cancel")

    second = system.create("after", args={"interval_s": 0.5})
    system.wait_status(second["id"], "Processing", timeout=60)
    assert system.delete(f"/api/observers/{first['id']}").status_code == 202
    system.wait_status(first["id"], "Deleted", timeout=60)


def test_a_cordoned_service_notices_its_start_queue_deleted(
    system: System, tmp_path: Path, rabbit: infra.RabbitNode, vhost: str
) -> None:
    """Cordoned, a service consumes nothing, so the broker sends it no cancel when the queue
    goes: before issue 62 it ran its observers on for ever on starts that no longer existed,
    and its drain's nacks then dropped them silently."""
    system.start_manager()
    system.start_service("leaving", workers=20)
    log = tmp_path / "ticks.log"
    ids = [system.create(f"d-{i}", kind="probe", args=probe_args(log, 0.2))["id"] for i in range(20)]
    for oid in ids:
        system.wait_status(oid, "Processing")
    system.start_service("small", workers=10)
    ids += [system.create(f"s-{i}", kind="probe", args=probe_args(log, 0.2))["id"] for i in range(10)]
    wait_for(lambda: on(system, "small", ids) == 10, 30, "ten on the small service")
    leaving = system.service_by_name("leaving")
    assert leaving is not None
    assert system.post(f"/api/services/{leaving['id']}/drain", {}).status_code == 202  # cordoned (no moves here)
    wait_for(lambda: "cordoned: no new starts here" in system.procs[1].text(), 30, "the cordon applied")

    rabbit.ctl("delete_queue", "-p", vhost, "orch.start.default")

    # The twenty of the cordoned service are fenced there and wait in the queue again; the
    # small one took its own ten back
    wait_for(lambda: ready(system) == 20, 30, "the cordoned service's twenty waiting in the queue")
    wait_for(lambda: on(system, "leaving", ids) == 0 and on(system, "small", ids) == 10, 30, "ten on small only")
    # Uncordoned, it takes them back; no observer ever ran on two services
    assert system.post(f"/api/services/{leaving['id']}/uncordon", {}).status_code == 200
    wait_for(lambda: all(system.observer(i)["status"] == "Processing" for i in ids), 30, "all 30 running again")
    assert_never_on_two_services(log)


def ready(system: System) -> int:
    """Ready starts in the default pool's queue (-1 while it does not exist)."""
    try:
        return system.queue_counts("orch.start.default")[0]
    except Exception:  # noqa: BLE001 - deleted and not declared again yet
        return -1


def on(system: System, name: str, ids: list[str]) -> int:
    svc = system.service_by_name(name)
    assert svc is not None
    running = (system.observer(oid) for oid in ids)
    return sum(1 for o in running if o["status"] == "Processing" and o["service_id"] == svc["id"])
