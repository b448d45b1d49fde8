"""Operators (issue #4): bearer tokens, limits, /metrics on the manager and the services,
JSON logs, history, search and sort."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tools import infra
from tools.harness import System, free_port, read_ticks, wait_for

ADMIN, READER = "admin-token-1", "reader-token-1"


def test_tokens_guard_the_api_and_secrets_never_leak(system: System) -> None:
    system.token = ADMIN
    system.start_manager(ORCH_API_TOKENS=ADMIN, ORCH_API_READ_TOKENS=READER)
    system.start_service("svc-a", workers=5)
    url = system.base_url + "/api/observers"

    missing = httpx.get(url)
    assert missing.status_code == 401 and "Authorization: Bearer" in missing.json()["detail"]
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = httpx.get(url, headers={"Authorization": "Bearer nope-nope-nope"})
    assert wrong.status_code == 401 and wrong.json()["detail"] == "invalid token"
    reader = {"Authorization": f"Bearer {READER}"}
    assert httpx.get(url, headers=reader).status_code == 200
    refused = httpx.post(url, json={"name": "r1", "kind": "ticker"}, headers=reader)
    assert refused.status_code == 403 and "read-only" in refused.json()["detail"]
    assert httpx.get(system.base_url + "/healthz").status_code == 200  # public
    created = system.create("a1", args={"interval_s": 0.2})
    system.wait_status(created["id"], "Processing")

    # Neither the broker's nor the database's password shows in logs or API answers.
    secrets = {urlsplit(system.amqp_url).password, urlsplit(system.database_url).password} - {None, ""}
    assert secrets
    answers = system.get("/api/services").text + system.get("/api/observers").text + system.get("/api/stats").text
    logs = system.logs()
    for secret in secrets:
        assert str(secret) not in answers and str(secret) not in logs
    assert ADMIN not in logs and READER not in logs


def test_an_open_api_is_announced_loudly(system: System) -> None:
    system.start_manager()
    assert system.manager is not None
    wait_for(lambda: "THE API IS OPEN" in system.manager.text(), 10, "the warning")  # type: ignore[union-attr]


def test_limits_give_clear_errors(system: System) -> None:
    system.start_manager(ORCH_MAX_BODY_BYTES="100000")
    system.start_service("svc-a", workers=5)
    big_args = {"padding": "x" * 70_000}  # the size is checked before the kind's own args
    too_big = system.post("/api/observers", {"name": "big", "kind": "ticker", "args": big_args})
    assert too_big.status_code == 422 and "the limit is 65536" in too_big.json()["detail"]
    huge = system.post("/api/observers", {"name": "huge", "kind": "ticker", "args": {"padding": "x" * 200_000}})
    assert huge.status_code == 413 and "ORCH_MAX_BODY_BYTES" in huge.json()["detail"]
    assert system.get("/api/observers", limit=1001).status_code == 422
    bad_name = system.post("/api/observers", {"name": "has space", "kind": "ticker"})
    assert bad_name.status_code == 422 and "name" in bad_name.json()["detail"]
    assert system.get("/api/observers").json()["items"] == []


def test_metrics_of_the_manager_and_of_a_service(system: System) -> None:
    system.start_manager()
    port = free_port()
    system.start_service("svc-a", workers=5, ORCH_METRICS_PORT=str(port))
    created = system.create("m1", args={"interval_s": 0.2})
    system.wait_status(created["id"], "Processing")

    def manager_metrics() -> str:
        return system.get("/metrics").text

    def applied() -> float:  # counted by the state process, served through the API's /metrics
        lines = [x for x in manager_metrics().splitlines() if x.startswith("orch_state_messages_applied_total ")]
        return float(lines[0].split()[1]) if lines else 0.0

    wait_for(applied, 10, "state messages applied in /metrics")
    text = manager_metrics()
    assert 'orch_observers{kind="ticker",pool="default",status="Processing"} 1.0' in text
    assert 'orch_pool_workers{pool="default"} 5.0' in text and 'orch_pool_workers_free{pool="default"} 4.0' in text
    assert 'orch_services{state="alive"} 1.0' in text and "orch_state_queue_backlog" in text
    assert 'route="/api/observers/{observer_id}"' in text  # latency per route template, not per id

    def service_metrics() -> str:
        return httpx.get(f"http://127.0.0.1:{port}/metrics").text

    wait_for(lambda: "orch_service_emits_total 0.0" not in service_metrics(), 20, "emits")
    text = service_metrics()
    assert "orch_service_observers_running 1.0" in text and "orch_service_loop_lag_seconds" in text
    assert "orch_service_observer_restarts_total 0.0" in text


@pytest.mark.usefixtures("with_test_plugin")  # its cpu_hog blocks the loop when run async
def test_a_services_probes_tell_a_lost_broker_from_a_blocked_loop(
    system: System, rabbit: infra.RabbitNode, vhost: str
) -> None:
    """Issue 63: /healthz fails only when the event loop stands still, /readyz only while no
    broker session consumes; prometheus_client's server answered 200 on every path."""
    port = free_port()
    service = system.start_service("svc-a", workers=5, wait=False, ORCH_METRICS_PORT=str(port), ORCH_HEALTH_STALL_S="3")

    def probe(path: str) -> tuple[int, dict[str, Any]]:
        response = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)
        return response.status_code, response.json()

    wait_for(lambda: probe("/readyz") == (200, {"status": "consuming", "pools": ["default"]}), 60, "ready")
    assert probe("/healthz")[0] == 200 and probe("/nope")[0] == 404

    # The broker's data gone (its connections closed, the vhost refused for a while): not
    # ready, still healthy; ready again once the broker takes it back.
    rabbit.delete_vhost(vhost)
    wait_for(lambda: probe("/readyz")[0] == 503, 30, "not ready without a broker session")
    said = probe("/readyz")[1]
    assert said["status"] == "not consuming" and said["detail"], said
    assert probe("/healthz")[0] == 200
    rabbit.add_vhost(vhost)
    wait_for(lambda: probe("/readyz")[0] == 200, 60, "ready again")

    # An observer that blocks the event loop: unhealthy (a restart moves its observers),
    # though the broker session lives on its own thread.
    system.start_manager()
    system.create("blocker", kind="cpu_hog", isolation="async")
    wait_for(lambda: probe("/healthz")[0] == 503, 30, "unhealthy with the loop blocked")
    assert probe("/healthz")[1]["status"] == "event loop stalled"
    service.kill9()


def test_a_service_whose_metrics_port_is_taken_says_so_and_exits(system: System) -> None:
    system.start_manager()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc = system.start_service("svc-a", workers=5, wait=False, ORCH_METRICS_PORT=str(port))
        assert proc.popen.wait(60) == 2
    said = proc.text()
    assert f"cannot serve metrics on 127.0.0.1:{port} (Address already in use)" in said, said
    assert "Traceback" not in said, said
    assert system.services() == []  # it never told the manager it exists


def test_a_virtual_host_the_broker_refuses_is_named_in_the_logs(system: System) -> None:
    # aiormq says only "Expected one of ['Connection.OpenOk'], got <Connection.Close object at
    # 0x...>", which a mistyped vhost in ORCH_AMQP_URL used to print every second
    wrong = system.amqp_url.rsplit("/", 1)[0] + "/no-such-vhost"
    manager = system.start_manager(wait=False, ORCH_AMQP_URL=wrong)
    service = system.start_service("svc-a", workers=5, wait=False, ORCH_AMQP_URL=wrong)
    said = "the broker refused the virtual host 'no-such-vhost' to user 'orch': it does not exist"
    for proc in (manager, service):
        wait_for(lambda proc=proc: said in proc.text(), 60, f"{proc.name} to name the vhost")  # type: ignore[misc]
        assert "Connection.OpenOk" not in proc.text(), proc.text()[-3000:]


def test_json_logs_carry_service_and_observer_ids(system: System, plugin_path: Path) -> None:
    system.start_manager(ORCH_LOG_FORMAT="json")
    service = system.start_service("svc-a", workers=5, ORCH_LOG_FORMAT="json", PYTHONPATH=str(plugin_path))
    created = system.create("j1", kind="flaky", args={"fail_runs": 1}, retry={"initial_delay_s": 0.1})

    def observer_line() -> dict[str, object]:
        for line in service.text().splitlines():
            if line.startswith("{") and created["id"] in line and "flaky failure" in line:
                record: dict[str, object] = json.loads(line)
                return record
        return {}

    record = wait_for(observer_line, 20, "the observer's JSON log line")
    assert record["observer_id"] == created["id"] and record["level"] == "WARNING"
    svc = system.service_by_name("svc-a")
    assert svc is not None and record["service_id"] == svc["id"] and record["role"] == "service:svc-a"
    for line in service.text().splitlines():
        if line.strip():
            json.loads(line)  # every line is JSON


def test_history_search_sort_and_counts_per_kind(system: System, tmp_path: Path, plugin_path: Path) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=10, PYTHONPATH=str(plugin_path))
    log = tmp_path / "runs.log"
    flaky = system.create(
        "Flaky-One", kind="flaky", args={"fail_runs": 2, "log_file": str(log)}, retry={"initial_delay_s": 0.1}
    )
    calm = [system.create(f"calm-{i}") for i in range(3)]
    wait_for(lambda: len(read_ticks(log)) == 3, 30, "two retries")
    wait_for(lambda: system.observer(flaky["id"])["attempts"] == 3, 30, "attempts == 3")
    for obs in calm:
        system.wait_status(obs["id"], "Processing")

    by_attempts = system.get("/api/observers", sort="attempts", limit=2).json()
    assert by_attempts["items"][0]["id"] == flaky["id"] and by_attempts["next_cursor"]
    rest = system.get("/api/observers", sort="attempts", limit=10, cursor=by_attempts["next_cursor"]).json()
    seen = [o["id"] for o in by_attempts["items"] + rest["items"]]
    assert sorted(seen) == sorted([flaky["id"]] + [o["id"] for o in calm])  # every one exactly once
    assert [o["name"] for o in system.get("/api/observers", q="flaky-o").json()["items"]] == ["Flaky-One"]
    assert system.get("/api/observers", q="%").json()["items"] == []  # a literal, not a wildcard
    kinds = system.get("/api/stats").json()["kinds"]
    assert kinds == {"flaky": {"Processing": 1}, "ticker": {"Processing": 3}}

    assert system.delete(f"/api/observers/{calm[0]['id']}").status_code == 202
    system.wait_status(calm[0]["id"], "Deleted")
    history = system.get(f"/api/observers/{calm[0]['id']}/events").json()
    assert [e["event"] for e in history] == ["created", "started", "stop_requested", "stopped"]
    svc = system.service_by_name("svc-a")
    assert svc is not None and history[1]["service_id"] == svc["id"]
    assert system.get(f"/api/observers/{calm[0]['id']}/events", after=history[1]["id"]).json() == history[2:]


def test_a_setting_that_does_not_validate_is_named_in_one_line(system: System) -> None:
    # Pydantic's error came with a traceback and the field's name, not the variable's
    service = system.start_service("svc-a", wait=False, ORCH_WORKERS_COUNT="lots")
    manager = system.start_manager(wait=False, ORCH_STATE_PREFETCH="many")
    for proc, said in (
        (service, "invalid setting ORCH_WORKERS_COUNT='lots': Input should be a valid integer"),
        (manager, "invalid setting ORCH_STATE_PREFETCH='many': Input should be a valid integer"),
    ):
        assert proc.popen.wait(60) == 2
        text = proc.text()
        assert said in text and "Traceback" not in text, text


def test_services_restarted_under_new_names_are_forgotten_after_the_retention(system: System) -> None:
    """Issue 63: on Kubernetes each pod is a service named after it; 20 restarts under new
    names (stopped, or killed and judged lost) leave nothing listed once the retention passed."""
    system.start_manager(ORCH_SERVICES_RETENTION_S="2")
    system.start_service("pod-keep", workers=5)
    for batch in range(4):
        procs = [system.start_service(f"pod-{batch}-{i}", workers=5) for i in range(5)]
        for i, proc in enumerate(procs):
            if i == 0:
                proc.kill9()  # judged lost, as a pod killed with its node
            else:
                assert proc.terminate() == 0
    wait_for(
        lambda: [s["name"] for s in system.services()] == ["pod-keep"],
        60,
        f"only the live service listed (now {[(s['name'], s['status']) for s in system.services()]})",
    )
