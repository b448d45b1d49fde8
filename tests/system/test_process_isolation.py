"""Process isolation in a real service (issue #3): a CPU hog, a memory hog and a crashing
child hurt neither their sibling observers nor the service; an ``async`` observer that
blocks is named by the service's watchdog."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tools.harness import System, probe_args, read_ticks, wait_for

FAST_RETRY = {"initial_delay_s": 0.2, "factor": 1.0, "jitter": 0.0, "max_attempts": None}


@pytest.fixture
def plugged(system: System, plugin_path: Path) -> System:
    system.env["PYTHONPATH"] = str(plugin_path)
    system.start_manager()
    return system


def sibling_ticker(system: System, tmp_path: Path) -> tuple[dict[str, object], Path]:
    """An ``async`` ticker beside the misbehaving observer (a probe: its ticks are logged)."""
    log = tmp_path / "ticks.log"
    created = system.create("sibling", kind="probe", args=probe_args(log, 0.2, emit=False))
    return system.wait_status(str(created["id"]), "Processing"), log


def retry_errors(system: System, observer_id: str) -> list[str]:
    history = system.get(f"/api/observers/{observer_id}/events", limit=1000).json()
    return [str(e["detail"]) for e in history if e["event"] == "retrying"]


def assert_untouched(system: System, sibling: dict[str, object], log: Path, service_pid: int) -> None:
    now = system.observer(str(sibling["id"]))
    assert now["status"] == "Processing" and now["service_id"] == sibling["service_id"] and now["attempts"] == 1
    ticks = read_ticks(log)
    assert {pid for _, _, pid, _ in ticks} == {service_pid}
    gaps = [b[3] - a[3] for a, b in itertools.pairwise(ticks)]
    assert max(gaps) < 2.0, f"the sibling ticker stalled for {max(gaps):.1f}s"  # generous: it ticks every 0.2 s
    svc = system.service_by_name("svc-a", pid=service_pid)
    assert svc is not None and svc["status"] == "alive"


def test_a_cpu_hog_in_a_child_leaves_its_siblings_and_the_service_alone(plugged: System, tmp_path: Path) -> None:
    service = plugged.start_service("svc-a", workers=5, ORCH_PROCESS_SLOTS="2")
    sibling, log = sibling_ticker(plugged, tmp_path)
    hog = plugged.create("hog", kind="cpu_hog")  # the kind's own isolation is "process"
    assert plugged.wait_status(hog["id"], "Processing")["isolation"] is None
    first = len(read_ticks(log))
    wait_for(lambda: len(read_ticks(log)) >= first + 30, 30, "30 more ticks while the hog burns a core")
    assert_untouched(plugged, sibling, log, service.popen.pid)
    assert plugged.observer(hog["id"])["attempts"] == 1  # never restarted: nothing hurt it either
    # A stop kills the child after the grace (it ignores the cooperative stop).
    assert plugged.delete(f"/api/observers/{hog['id']}").status_code == 202
    plugged.wait_status(hog["id"], "Deleted")


def test_a_memory_hog_is_killed_at_its_limit_and_restarted(plugged: System, tmp_path: Path) -> None:
    service = plugged.start_service("svc-a", workers=5)
    sibling, log = sibling_ticker(plugged, tmp_path)
    hog = plugged.create("hog", kind="memory_hog", args={"mb_per_s": 200}, memory_limit_mb=150, retry=FAST_RETRY)
    wait_for(lambda: len(retry_errors(plugged, hog["id"])) >= 2, 60, "two restarts of the hog")
    errors = retry_errors(plugged, hog["id"])
    assert all("memory limit exceeded" in e for e in errors), errors
    assert plugged.observer(hog["id"])["status"] == "Processing"
    assert_untouched(plugged, sibling, log, service.popen.pid)


def test_a_crashing_child_restarts_that_observer_only(plugged: System, tmp_path: Path) -> None:
    service = plugged.start_service("svc-a", workers=5)
    sibling, log = sibling_ticker(plugged, tmp_path)
    runs = tmp_path / "runs.log"
    crasher = plugged.create(
        "crasher", kind="crasher", args={"delay_s": 0.5, "log_file": str(runs)}, isolation="process", retry=FAST_RETRY
    )
    wait_for(lambda: len(retry_errors(plugged, crasher["id"])) >= 2, 60, "two restarts")
    errors = retry_errors(plugged, crasher["id"])
    assert all("3" in e for e in errors), errors  # exit code 3
    pids = {pid for _, _, pid, _ in read_ticks(runs)}
    assert len(pids) >= 2 and service.popen.pid not in pids  # a new child each time, never the service
    assert_untouched(plugged, sibling, log, service.popen.pid)


def test_a_blocking_async_observer_is_named_by_the_watchdog(plugged: System) -> None:
    service = plugged.start_service("svc-a", workers=5)
    hog = plugged.create("blocker", kind="cpu_hog", isolation="async")
    wait_for(lambda: f"by observer {hog['id']}" in service.text(), 30, "the watchdog's warning")
    assert "event loop blocked" in service.text()
