"""Fencing: an observer never acts on two hosts at the same moment. (Issue #2 test 12.)

Observers (the test plug-in's ``probe``) append "observer service pid time" to a shared file
after ``ctx.ensure_lease()``.
Per observer, the ticks of one host that follow each other closely form an interval of
activity; intervals of different hosts must never overlap."""

from __future__ import annotations

import itertools
import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tools import infra
from tools.harness import FAST_ENV, System, probe_args, read_ticks, wait_for

INTERVAL_S = 0.05
pytestmark = pytest.mark.usefixtures("with_test_plugin")


def activity_intervals(log: Path) -> dict[str, list[tuple[str, float, float]]]:
    """observer -> [(service, first tick, last tick)] of each run of consecutive ticks."""
    per_observer: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for observer, service, _pid, at in read_ticks(log):
        per_observer[observer].append((service, at))
    result: dict[str, list[tuple[str, float, float]]] = {}
    for observer, ticks in per_observer.items():
        ticks.sort(key=lambda t: t[1])
        runs: list[tuple[str, float, float]] = []
        for service, at in ticks:
            if runs and runs[-1][0] == service:
                runs[-1] = (service, runs[-1][1], at)
            else:
                runs.append((service, at, at))
        result[observer] = runs
    return result


def assert_never_on_two_hosts(log: Path) -> int:
    """Return how many times an observer changed host; fail on any interleaving."""
    moves = 0
    for observer, runs in activity_intervals(log).items():
        last_seen: dict[str, float] = {}
        for service, start, end in runs:
            for other, other_end in last_seen.items():
                # A host whose run ended before this one started may come back later (it
                # got the delivery back), but never while the other one is still active.
                assert other == service or other_end < start, (observer, runs)
            last_seen[service] = end
        for (s1, _, end1), (s2, start2, _) in itertools.pairwise(runs):
            assert s1 != s2 and end1 < start2
            moves += 1
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
    assert_never_on_two_hosts(log)


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
    moves = assert_never_on_two_hosts(log)
    assert moves >= 1, "the broker should have moved observers while svc-a was frozen"
    # The log says the process was stopped, and blames no observer (nor the collector) for it
    woken = victim.text()
    assert "the whole service process was not running for" in woken, woken[-3000:]
    assert "event loop blocked" not in woken and "garbage collection paused" not in woken, woken[-3000:]
