"""The observer runtime (issue #3): plug-in kinds, the kinds catalog and validation,
retries in place, Failed + dead-letter + restart, history, probation of a poison observer."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aio_pika
import pytest

from shared import topology
from shared.messages import StopObservers
from tools.harness import System, read_ticks, unique, wait_for

FAST_RETRY = {"initial_delay_s": 0.1, "factor": 1.0, "jitter": 0.0}


@pytest.fixture
def plugged(system: System, plugin_path: Path) -> System:
    """A system whose services have the test plug-in installed."""
    system.env["PYTHONPATH"] = str(plugin_path)
    return system


def events(system: System, observer_id: str) -> list[dict[str, object]]:
    response = system.get(f"/api/observers/{observer_id}/events", limit=1000)
    assert response.status_code == 200, response.text
    body: list[dict[str, object]] = response.json()
    return body


def event_names(system: System, observer_id: str) -> list[object]:
    return [e["event"] for e in events(system, observer_id)]


def test_plugin_kind_is_discovered_listed_validated_and_run(plugged: System) -> None:
    plugged.start_manager()
    service = plugged.start_service("svc-a", workers=5)

    # The kinds catalog lists the plug-in's kinds with their args schemas; the broken entry
    # point is skipped with a log line and does not stop the service.
    kinds = {k["name"]: k for k in plugged.get("/api/kinds").json()}
    assert {"ticker", "echo", "flaky", "cpu_hog"} <= set(kinds)
    assert "broken" not in kinds
    echo = kinds["echo"]
    assert echo["builtin"] is False and echo["pools"] == ["default"] and echo["services"] == 1
    assert "message" in echo["args_schema"]["properties"] and echo["isolation"] == "async"
    assert kinds["cpu_hog"]["isolation"] == "process" and kinds["ticker"]["builtin"] is True
    assert "no_such_module" in service.text() and service.alive()

    # Args are validated against the announced schema before anything is queued.
    missing = plugged.post("/api/observers", {"name": "e0", "kind": "echo", "args": {}})
    assert missing.status_code == 422 and "message" in missing.json()["detail"]
    wrong = plugged.post("/api/observers", {"name": "e0", "kind": "echo", "args": {"message": "x", "interval_s": -1}})
    assert wrong.status_code == 422 and "interval_s" in wrong.json()["detail"]
    limit = plugged.post(
        "/api/observers", {"name": "e0", "kind": "echo", "args": {"message": "x"}, "memory_limit_mb": 50}
    )
    assert limit.status_code == 422 and "isolation" in limit.json()["detail"]
    assert plugged.get("/api/observers").json()["items"] == []

    async def bind(channel: aio_pika.abc.AbstractChannel) -> None:
        queue = await channel.declare_queue("test.echo", durable=True)
        await queue.bind(topology.EVENTS_EXCHANGE, routing_key="echo.#")

    plugged.amqp(bind)
    created = plugged.create("echo-1", kind="echo", args={"message": "hello"})
    plugged.wait_status(created["id"], "Processing")

    async def one_event(channel: aio_pika.abc.AbstractChannel) -> dict[str, object]:
        queue = await channel.declare_queue("test.echo", passive=True)
        message = await queue.get(fail=True)
        body: dict[str, object] = json.loads(message.body)
        return body | {"routing_key": message.routing_key}

    event = wait_for(lambda: plugged.amqp(one_event), 20, "an echo event", every=0.5)
    assert event["routing_key"] == "echo.echo-1" and event["payload"] == {"echo": "hello"}


def test_an_observer_that_fails_is_restarted_in_place_with_backoff(plugged: System, tmp_path: Path) -> None:
    plugged.start_manager()
    plugged.start_service("svc-a", workers=5)
    log = tmp_path / "runs.log"
    created = plugged.create(
        "flaky-1", kind="flaky", args={"fail_runs": 2, "log_file": str(log)}, retry=FAST_RETRY | {"max_attempts": 5}
    )
    assert created["retry"]["max_attempts"] == 5 and created["retry"]["reset_after_s"] == 60.0

    # Two failed runs, then a third that keeps running, all on the same service and delivery.
    wait_for(lambda: len(read_ticks(log)) == 3, 30, "three runs")
    obs = wait_for(lambda: (o := plugged.observer(created["id"]))["attempts"] == 3 and o, 30, "attempts == 3")
    assert obs["status"] == "Processing" and "flaky failure 2" in obs["last_error"]
    assert len({service for _, service, _, _ in read_ticks(log)}) == 1
    assert event_names(plugged, created["id"]) == ["created", "started", "retrying", "retrying"]


def test_exhausted_retries_fail_dead_letter_and_restart_gives_a_new_life(plugged: System, tmp_path: Path) -> None:
    plugged.start_manager()
    plugged.start_service("svc-a", workers=5)
    created = plugged.create("flaky-2", kind="flaky", args={"fail_runs": 3}, retry=FAST_RETRY | {"max_attempts": 3})
    oid = created["id"]

    failed = plugged.wait_status(oid, "Failed")
    assert "gave up after 3 attempt(s)" in failed["last_error"] and "flaky failure 3" in failed["last_error"]
    # Its start message is kept in the pool's error queue, not lost and not run again.
    error_queue = topology.error_queue_name(topology.start_queue_name("default"))
    wait_for(lambda: plugged.queue_counts(error_queue)[0] == 1, 20, "the start in the error queue")

    # Only a Failed observer can be restarted; a restart is a new life (the 4th run succeeds).
    assert plugged.post(f"/api/observers/{unique('x')}/restart", {}).status_code == 422  # not a uuid
    other = plugged.create("ticker-1")
    refused = plugged.post(f"/api/observers/{other['id']}/restart", {})
    assert refused.status_code == 409 and "only a Failed observer" in refused.json()["detail"]
    restarted = plugged.post(f"/api/observers/{oid}/restart", {})
    assert restarted.status_code == 202, restarted.text
    assert restarted.json()["status"] in ("Created", "Processing")
    obs = plugged.wait_status(oid, "Processing")
    assert obs["attempts"] == 1
    history = event_names(plugged, oid)
    assert history[:5] == ["created", "started", "retrying", "retrying", "failed"]
    assert history[5:] == ["restarted", "started"]


def test_an_observer_that_keeps_killing_its_services_ends_failed_in_its_own_process(
    plugged: System, tmp_path: Path
) -> None:
    """Two service deaths put it on probation: its third service runs it in a child process, where
    killing "its service" kills only that child; its retry policy then fails it, and the third
    service lives on."""
    plugged.start_manager(ORCH_PROBATION_AFTER_HOST_DEATHS="2", ORCH_PROBATION_WINDOW_S="300")
    services = [plugged.start_service(f"svc-{n}", workers=5) for n in "abc"]
    log = tmp_path / "runs.log"
    # Kills its service 10 s after each start: slow enough that the manager judges each death
    # (3 missed 1 s heartbeats) and isolates it before the next service would die.
    created = plugged.create(
        "poison",
        kind="service_killer",
        args={"delay_s": 10, "log_file": str(log)},
        retry=FAST_RETRY | {"max_attempts": 2},
    )

    failed = plugged.wait_status(created["id"], "Failed", timeout=120)
    assert "gave up after 2 attempt(s)" in failed["last_error"] and "SIGKILL" in failed["last_error"]
    assert failed["probation"] is not None and failed["probation"]["isolated_since"] is not None
    history = event_names(plugged, created["id"])
    assert history.count("host_lost") == 2
    assert history.index("probation") < history.index("isolated") < history.index("failed")

    # Two services died; the third ran it in children, which is all it killed.
    wait_for(lambda: sum(p.alive() for p in services) == 1, 10, "two dead services")
    survivor = next(p for p in services if p.alive())
    assert "runs in a child process now" in survivor.text()
    time.sleep(3)
    assert survivor.alive()
    # Three services took it (the third was told to isolate it before it could act), then its
    # two attempts in children.
    pids = [pid for _, _, pid, _ in read_ticks(log)]
    assert len(pids) == 5 and pids[2] == survivor.popen.pid
    assert not {pids[3], pids[4]} & {p.popen.pid for p in services}


def test_a_body_that_ignores_cancellation_is_fenced_when_put_on_probation(plugged: System, tmp_path: Path) -> None:
    """Issue 62, item 5: probation moves an observer into a child process by cancelling its
    task first. One that swallows the cancellation is fenced (its context refuses side
    effects); ``stubborn`` asks before each tick, so it ends and runs on in a child; ``deaf``
    never asks, cannot be moved, and is Failed at once, saying why."""
    plugged.start_manager(
        ORCH_PROBATION_AFTER_HOST_DEATHS="1", ORCH_PROBATION_WINDOW_S="300", ORCH_PROBATION_BUDGET="1.0"
    )
    first = plugged.start_service("svc-a", workers=5, ORCH_STOP_GRACE_S="1")
    log = tmp_path / "runs.log"
    stubborn = plugged.create("stubborn-1", kind="stubborn", args={"log_file": str(log)})
    deaf = plugged.create("deaf-1", kind="deaf", args={"log_file": str(log)})
    for created in (stubborn, deaf):
        plugged.wait_status(created["id"], "Processing")
    second = plugged.start_service("svc-b", workers=5, ORCH_STOP_GRACE_S="1")

    first.kill9()  # one service's death puts both on probation: svc-b must move them into children

    failed = plugged.wait_status(deaf["id"], "Failed", timeout=60)
    assert "ignored cancellation and then its fence" in failed["last_error"], failed
    wait_for(
        lambda: (plugged.observer(stubborn["id"])["probation"] or {}).get("isolated_since") is not None,
        60,
        "stubborn running in a child process",
    )
    moved = plugged.observer(stubborn["id"])
    assert moved["status"] == "Processing" and moved["service_name"] == "svc-b", moved
    assert "fenced, its context allows no more side effects" in second.text()
    assert second.alive()

    # Fenced, stubborn ticked no more in svc-b's process; its child ticks on.
    time.sleep(2)
    ticks = [(pid, at) for oid, _, pid, at in read_ticks(log) if oid == stubborn["id"]]
    in_service = [at for pid, at in ticks if pid == second.popen.pid]
    in_child = [at for pid, at in ticks if pid not in (first.popen.pid, second.popen.pid)]
    assert in_service and in_child and max(in_service) < min(in_child), ticks


def test_a_service_without_the_kind_hands_the_start_to_one_that_has_it(system: System, plugin_path: Path) -> None:
    system.start_manager()
    system.start_service("bare", workers=5)  # no plug-in
    with_plugin = system.start_service("plugged", workers=5, PYTHONPATH=str(plugin_path))
    assert with_plugin.alive()
    created = system.create("echo-2", kind="echo", args={"message": "hi"})
    obs = system.wait_status(created["id"], "Processing", timeout=60)
    assert obs["service_name"] == "plugged"


def test_pools_route_observers_and_capacity_comes_from_the_machine(system: System, plugin_path: Path) -> None:
    system.start_manager()
    system.start_service("svc-default", workers=5)
    system.start_service("svc-gpu", workers=2, ORCH_POOLS="gpu")
    system.start_service("svc-auto", ORCH_POOLS="io", ORCH_WORKERS_COUNT="auto", PYTHONPATH=str(plugin_path))

    auto = system.service_by_name("svc-auto")
    assert auto is not None and auto["workers_count"] >= 1 and 0 <= auto["process_slots"] <= auto["workers_count"]
    gpu = [system.create(f"g{i}", pool="gpu", args={"emit": False}) for i in range(2)]
    for created in gpu:
        assert system.wait_status(created["id"], "Processing")["service_name"] == "svc-gpu"
    full = system.post("/api/observers", {"name": "g3", "kind": "ticker", "pool": "gpu"})
    assert full.status_code == 503 and "pool 'gpu' is full" in full.json()["detail"]
    nobody = system.post("/api/observers", {"name": "n1", "kind": "ticker", "pool": "nope"})
    assert nobody.status_code == 503 and "no live observer service serves pool 'nope'" in nobody.json()["detail"]
    # The plug-in kind is offered only where its service runs.
    elsewhere = system.post("/api/observers", {"name": "e1", "kind": "echo", "args": {"message": "x"}})
    assert elsewhere.status_code == 422 and "offered in: io" in elsewhere.json()["detail"]
    echo = system.create("e1", kind="echo", args={"message": "x"}, pool="io")
    assert system.wait_status(echo["id"], "Processing")["service_name"] == "svc-auto"

    capacity = system.get("/api/stats").json()["capacity"]
    assert capacity["gpu"] == {"total": 2, "used": 2, "free": 0}
    assert capacity["default"] == {"total": 5, "used": 0, "free": 5}
    assert capacity["io"]["used"] == 1 and capacity["io"]["total"] == auto["workers_count"]


def test_a_stop_from_a_manager_whose_clock_runs_ahead_does_not_eat_a_restart(plugged: System) -> None:
    """A service remembers a broadcast stop for an observer it does not run (its start may be
    on the way). Stamped by a manager whose clock is an hour ahead, that stop looked newer
    than the start of a later restart, which was thrown away; stops and starts now carry
    the observer's life (restarts after Failed), so the restart runs."""
    plugged.start_manager()
    service = plugged.start_service("svc-a", workers=5)
    created = plugged.create("one-life", kind="flaky", args={"fail_runs": 1}, retry=FAST_RETRY | {"max_attempts": 1})
    oid = created["id"]
    plugged.wait_status(oid, "Failed")
    ahead = datetime.now(UTC) + timedelta(hours=1)
    stale = StopObservers(observer_ids=[uuid.UUID(oid)], reason="test: an old life's stop", lives=[0], sent_at=ahead)
    plugged.publish_raw("", stale.encode(), exchange=topology.CONTROL_EXCHANGE)
    time.sleep(1)  # delivered to the service, which remembers it
    assert plugged.post(f"/api/observers/{oid}/restart", {}).status_code == 202
    restarted = plugged.wait_status(oid, "Processing", timeout=30)
    assert restarted["service_name"] == "svc-a"
    assert "was stopped before its start arrived" not in service.text()
