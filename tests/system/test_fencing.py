"""Fencing: an observer never acts on two services at the same moment. (Issue #2 test 12.)

Observers (the test plug-in's ``probe``) append "observer service pid time run" to a shared
file after ``ctx.ensure_lease()``, ``run`` a token of one start of the observer on one service.
Each run's ticks span an interval of activity, from its first tick to its last; intervals of
runs on different services must never overlap.

The intervals were once cut from the merged ticks of all services, a new one at each change of
service: two services ticking at once then made one-tick intervals that alternated and never
overlapped, and the check passed on a service that acted for 5 s after its observers had
moved (a lease that never lapsed, under a network partition)."""

from __future__ import annotations

import itertools
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tools import infra
from tools.harness import FAST_ENV, System, probe_args, read_probe_lines, wait_for
from tools.partition import Direction, Partition

INTERVAL_S = 0.05
pytestmark = pytest.mark.usefixtures("with_test_plugin")


def activity_intervals(log: Path) -> dict[str, list[tuple[str, float, float]]]:
    """observer -> [(service, first tick, last tick)] of each of its runs, by first tick."""
    spans: dict[tuple[str, str, str], tuple[float, float]] = {}
    for observer, service, _pid, at, run in read_probe_lines(log):
        assert run, "a probe line without a run token"
        first, last = spans.get((observer, service, run), (at, at))
        spans[observer, service, run] = (min(first, at), max(last, at))
    result: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
    for (observer, service, _run), (first, last) in spans.items():
        result[observer].append((service, first, last))
    for runs in result.values():
        runs.sort(key=lambda r: r[1])
    return dict(result)


def assert_never_on_two_services(log: Path) -> int:
    """Return how many times an observer changed service; fail if two of its runs on different
    services were active at the same moment."""
    moves = 0
    for observer, runs in activity_intervals(log).items():
        for (s1, start1, end1), (s2, start2, end2) in itertools.combinations(runs, 2):
            assert s1 == s2 or end1 < start2 or end2 < start1, (observer, runs)
        moves += sum(1 for (s1, _, _), (s2, _, _) in itertools.pairwise(runs) if s1 != s2)
    return moves


def run_fleet(system: System, tmp_path: Path, count: int) -> tuple[list[str], Path]:
    system.start_manager()
    system.start_service("svc-a", workers=count)
    log = tmp_path / "ticks.log"
    ids = [system.create(f"f-{i}", kind="probe", args=probe_args(log, INTERVAL_S))["id"] for i in range(count)]
    for oid in ids:
        system.wait_status(oid, "Processing")
    system.start_service("svc-b", workers=count)
    return ids, log


def test_closed_connection_fences_the_service(system: System, tmp_path: Path, rabbit: infra.RabbitNode) -> None:
    ids, log = run_fleet(system, tmp_path, 4)
    victim = system.procs[1]
    time.sleep(0.5)

    listing = rabbit.ctl("-q", "list_connections", "--no-table-headers", "pid", "client_properties")
    pids = [line.split("\t")[0] for line in listing.splitlines() if '"observer-service svc-a"' in line]
    assert pids, listing
    for pid in pids:
        rabbit.ctl("close_connection", pid, "test: cut svc-a off")

    wait_for(lambda: "fenced 4 observer(s)" in victim.text(), 20, "svc-a fenced its observers")
    wait_for(lambda: all(system.observer(i)["status"] == "Processing" for i in ids), 30, "running again")
    time.sleep(2)
    assert victim.alive()
    assert_never_on_two_services(log)


def test_frozen_service_does_not_act_after_waking(system: System, tmp_path: Path) -> None:
    ids, log = run_fleet(system, tmp_path, 4)
    victim = system.procs[1]
    time.sleep(0.5)

    victim.signal(signal.SIGSTOP)
    time.sleep(3 * float(FAST_ENV["ORCH_AMQP_HEARTBEAT_S"]))
    victim.signal(signal.SIGCONT)

    wait_for(lambda: "fenced" in victim.text(), 20, "svc-a fenced itself after waking")
    wait_for(lambda: all(system.observer(i)["status"] == "Processing" for i in ids), 30, "running again")
    time.sleep(2)
    moves = assert_never_on_two_services(log)
    assert moves >= 1, "the broker should have moved observers while svc-a was frozen"
    # The log says the process was stopped, and blames no observer (nor the collector) for it
    woken = victim.text()
    assert "the whole service process was not running for" in woken, woken[-3000:]
    assert "event loop blocked" not in woken and "garbage collection paused" not in woken, woken[-3000:]


@pytest.mark.parametrize("direction", ["both", "to_server", "to_client"])
def test_a_partitioned_service_stops_acting_before_its_observers_move(
    system: System, tmp_path: Path, direction: Direction
) -> None:
    """Cut both ways, nothing tells either side, and only svc-a's lease (its round trip
    fails) stops it before the broker gives its observers away. Cut one way, the side that
    gives up first still tells the other: svc-a unheard (``to_server``) is closed by the
    broker after the heartbeats it missed, and hears the close; svc-a deaf (``to_client``)
    is still heard, so the broker keeps its connection and deliveries until svc-a's own
    heartbeat check gives up and closes it. (With a lease that never lapses, only the cut
    both ways fails here.)"""
    # Given svc-a reaching the broker through a network that can be cut, svc-b directly
    with Partition.before(system.amqp_url) as network:
        system.start_manager()
        victim = system.start_service("svc-a", workers=4, ORCH_AMQP_URL=network.url_for(system.amqp_url))
        # Their side effects are local (no emits, which would wait for the cut broker)
        log = tmp_path / "ticks.log"
        args = probe_args(log, INTERVAL_S, emit=False)
        ids = [system.create(f"f-{i}", kind="probe", args=args)["id"] for i in range(4)]
        for oid in ids:
            system.wait_status(oid, "Processing")
        system.start_service("svc-b", workers=4)
        svc_b = system.service_by_name("svc-b")
        assert svc_b is not None
        time.sleep(0.5)

        # When the network between svc-a and the broker drops everything (one way, or both):
        # svc-a runs on, its sockets stay open
        network.cut(direction)

        # Then the broker gives its observers to svc-b, and svc-a stopped acting before that
        wait_for(
            lambda: all(system.observer(i)["service_id"] == svc_b["id"] for i in ids), 60, "the observers on svc-b"
        )
        wait_for(lambda: "fenced 4 observer(s)" in victim.text(), 60, "svc-a to fence its observers")
        cause = "closed by broker or network" if direction == "to_server" else "no frame from the broker for"
        assert f"broker session lost: {cause}" in victim.text(), victim.text()[-3000:]
        time.sleep(1)
        moves = assert_never_on_two_services(log)
        assert moves >= 4, activity_intervals(log)

        # And when the network comes back svc-a serves again, having run nothing twice
        network.heal()
        wait_for(lambda: victim.text().count("broker session open") >= 2, 60, "svc-a to open a new session")
        time.sleep(1)
        assert victim.alive()
        assert_never_on_two_services(log)
        assert all(system.observer(i)["status"] == "Processing" for i in ids)
