"""A pool over several start queues (``ORCH_START_QUEUES``; docs/design.md, "A pool over several
start queues"): what holds for one queue holds for N. No service runs more than its workers
though no broker limit spans the queues; a free worker takes a start from whichever queue it is
in; a service's death moves its observers, once; and a layout of one queue becomes N and
goes back to one with nothing lost."""

from __future__ import annotations

import functools
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest

from shared import topology
from tests.system.test_consumer_records import listed_consumers
from tests.system.test_fencing import assert_never_on_two_services
from tools import infra
from tools.harness import System, free_port, probe_args, wait_for

pytestmark = pytest.mark.usefixtures("with_test_plugin")


def running_on(system: System) -> dict[str, int]:
    """Processing observers per service name."""
    counts: dict[str, int] = {}
    for o in system.observers(status="Processing"):
        counts[o["service_name"]] = counts.get(o["service_name"], 0) + 1
    return counts


def all_processing(system: System, ids: list[str]) -> bool:
    observers = {o["id"]: o for o in system.observers()}
    return all(observers[i]["status"] == "Processing" for i in ids)


def create(system: System, log: Path, names: list[str]) -> list[str]:
    body = {"observers": [{"name": n, "kind": "probe", "args": probe_args(log)} for n in names]}
    response = system.post("/api/observers/bulk", body)
    assert response.status_code == 201, response.text
    return [o["id"] for o in response.json()["items"]]


def test_no_service_runs_more_than_its_workers_and_a_free_worker_takes_any_queue(
    system: System, tmp_path: Path
) -> None:
    log = tmp_path / "ticks.log"
    system.start_manager(ORCH_START_QUEUES="3")
    system.start_service("svc-a", workers=2)
    # Alone, svc-a is offered its 2 free workers on each of the 3 queues at once: what comes
    # past them must go back, and to svc-b once it is there.
    ids = create(system, log, ["q-0", "q-1"])
    wait_for(lambda: all_processing(system, ids), 30, "both running on svc-a")
    system.start_service("svc-b", workers=2)
    ids += create(system, log, ["q-2", "q-3"])
    wait_for(lambda: all_processing(system, ids), 30, "all four running")
    assert running_on(system) == {"svc-a": 2, "svc-b": 2}
    for index in range(3):  # the manager declared them all; none holds a start nobody took
        assert system.queue_counts(topology.start_queue_name("default", index))[0] == 0

    # A full fleet: each stop frees one worker, and the next create, in whichever queue its
    # id sends it to, runs there.
    for i in range(6):
        victim = ids.pop(0)
        assert system.delete(f"/api/observers/{victim}").status_code == 202
        system.wait_status(victim, "Deleted")
        ids += create(system, log, [f"next-{i}"])
        live = list(ids)
        wait_for(functools.partial(all_processing, system, live), 30, f"the create after stop {i} running")
        assert running_on(system) == {"svc-a": 2, "svc-b": 2}
    assert_never_on_two_services(log)


def test_starts_past_a_services_workers_go_back_unrun(
    system: System, rabbit: infra.RabbitNode, vhost: str, tmp_path: Path
) -> None:
    """svc-a's death requeues its six starts into the three queues at once, and svc-b, with two
    free workers, is offered two on each: it runs two, and what came past them goes back to
    wait for room, then runs on svc-c."""
    log = tmp_path / "ticks.log"
    system.start_manager(ORCH_START_QUEUES="3")
    victim = system.start_service("svc-a", workers=6)
    ids = create(system, log, [f"x-{i}" for i in range(6)])
    wait_for(lambda: all_processing(system, ids), 30, "all on svc-a")
    port = free_port()
    taker = system.start_service("svc-b", workers=2, ORCH_METRICS_PORT=str(port))
    # svc-a, full, consumes nothing: one consumer on each queue is svc-b's, once its placement
    # (within a balance round) told it of all three.
    queues = topology.start_queue_names("default", 3)
    wait_for(lambda: [listed_consumers(rabbit, vhost, q) for q in queues] == [1] * 3, 30, "svc-b consuming every queue")

    victim.kill9()

    wait_for(lambda: running_on(system).get("svc-b") == 2, 60, "two running on svc-b")
    system.start_service("svc-c", workers=4)
    wait_for(lambda: running_on(system) == {"svc-b": 2, "svc-c": 4}, 60, "the other four on svc-c")
    assert taker.text().count(") started, redelivered=") == 2  # never more than its workers
    # Delivered at once: up to two from each queue holding any of the six.
    per_queue = Counter(topology.start_queue_index(uuid.UUID(i), 3) for i in ids)
    offered = sum(min(2, n) for n in per_queue.values())
    past = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    if offered > 2:
        assert "orch_service_starts_past_workers_total 0.0" not in past, per_queue
    assert_never_on_two_services(log)


def test_a_service_killed_moves_its_observers_once_over_several_queues(system: System, tmp_path: Path) -> None:
    log = tmp_path / "ticks.log"
    system.start_manager(ORCH_START_QUEUES="3")
    victim = system.start_service("svc-a", workers=6)
    ids = create(system, log, [f"k-{i}" for i in range(6)])
    wait_for(lambda: all_processing(system, ids), 30, "all on svc-a")
    system.start_service("svc-b", workers=3)
    system.start_service("svc-c", workers=3)

    victim.kill9()

    wait_for(lambda: running_on(system) == {"svc-b": 3, "svc-c": 3}, 60, "the six moved to svc-b and svc-c")
    wait_for(lambda: all_processing(system, ids), 30, "all Processing")
    assert_never_on_two_services(log)


def test_one_queue_becomes_three_and_back_with_nothing_lost(
    system: System, rabbit: infra.RabbitNode, vhost: str, tmp_path: Path
) -> None:
    log = tmp_path / "ticks.log"
    manager = system.start_manager()
    system.start_service("svc-a", workers=25)  # never full: it consumes every queue throughout
    ids = create(system, log, [f"one-{i}" for i in range(5)])
    wait_for(lambda: all_processing(system, ids), 30, "running on one queue")

    manager.terminate()
    manager = system.start_manager(ORCH_START_QUEUES="3")
    ids += create(system, log, [f"three-{i}" for i in range(10)])
    wait_for(lambda: all_processing(system, ids), 30, "running over three queues")
    third = topology.start_queue_name("default", 2)
    wait_for(lambda: listed_consumers(rabbit, vhost, third) == 1, 30, "queue 2 consumed")

    # Back to one: the manager publishes to the first queue only, and the services go on
    # consuming the other two, where starts of running observers are held.
    manager.terminate()
    system.start_manager()
    ids += create(system, log, [f"back-{i}" for i in range(5)])
    wait_for(lambda: all_processing(system, ids), 30, "running after the return to one queue")
    later = system.start_service("svc-b", workers=20)
    # The newcomer is told of the third queue too (the manager finds it still there).
    wait_for(lambda: listed_consumers(rabbit, vhost, third) == 2, 30, "queue 2 by both")

    # svc-a dies: its starts, in all three queues, go to svc-b.
    system.procs[1].kill9()
    wait_for(lambda: running_on(system) == {"svc-b": 20}, 60, "all twenty moved to svc-b")
    assert later.alive()
    assert_never_on_two_services(log)


def held_in(rabbit: infra.RabbitNode, vhost: str, queues: list[str]) -> dict[str, int]:
    """The starts each of ``queues`` that exists holds, waiting or delivered and not acked."""
    out = rabbit.ctl("list_queues", "-p", vhost, "-q", "--no-table-headers", "name", "messages")
    counts = {name: int(count) for name, count in (line.split() for line in out.splitlines() if line.strip())}
    return {q: counts[q] for q in queues if q in counts}


def test_lowered_start_queues_are_emptied_into_the_ones_kept_and_deleted_with_nothing_run_twice(
    system: System, rabbit: infra.RabbitNode, vhost: str, tmp_path: Path
) -> None:
    log = tmp_path / "ticks.log"
    system.env["ORCH_BALANCE_MOVES_PER_S"] = "20"  # a few rounds: moves of several services in turn
    system.env["ORCH_START_QUEUE_DELETE_AFTER_S"] = "2"
    manager = system.start_manager(ORCH_START_QUEUES="3")
    victim = system.start_service("svc-a", workers=30)
    taker = system.start_service("svc-b", workers=30)
    ids = create(system, log, [f"low-{i}" for i in range(30)])
    wait_for(lambda: all_processing(system, ids), 30, "running over three queues")
    names = topology.start_queue_names("default", 3)
    past = [names[index] for i in ids if (index := topology.start_queue_index(uuid.UUID(i), 3))]
    assert past
    # A quorum queue's counts are the leader's, published at its tick (seconds): waited for.
    wait_for(lambda: sorted(held_in(rabbit, vhost, names[1:]).values()) == sorted(Counter(past).values()), 30, "held")

    # Lowered to one: the services move every start off the two queues past it into the
    # first, stop consuming those two, and the manager deletes them.
    manager.terminate()
    system.start_manager()
    wait_for(
        lambda: held_in(rabbit, vhost, names) == {names[0]: 30}, 120, "all thirty in the first queue, the others gone"
    )
    wait_for(lambda: all_processing(system, ids), 30, "all Processing after the moves")
    moved = [i for i in ids if topology.start_queue_index(uuid.UUID(i), 3)]
    for observer_id in moved:
        details = [e.get("detail") or "" for e in system.get(f"/api/observers/{observer_id}/events").json()]
        assert any("past ORCH_START_QUEUES" in d for d in details), (observer_id, details)
    assert not listed_consumers(rabbit, vhost, names[1]) and not listed_consumers(rabbit, vhost, names[2])
    assert all(service.text().count("broker session open") == 1 for service in (victim, taker))

    # Nothing was lost on the way, and nothing ran twice: a service's death moves all thirty once.
    victim.kill9()
    wait_for(lambda: running_on(system) == {"svc-b": 30}, 60, "all thirty on svc-b")
    wait_for(lambda: held_in(rabbit, vhost, names) == {names[0]: 30}, 30, "all thirty still in the first queue")
    assert_never_on_two_services(log)
