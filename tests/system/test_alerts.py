"""The monitoring files of ``deploy/`` against a real manager and observer service: each
``/metrics`` answer passes ``promtool check metrics`` (Debian's promtool,
``tools/infra/promtool.py``), and every metric the alert rules and the Grafana dashboard
query is in those answers. On the way, ``orch_observers_stopping_oldest_seconds`` (the
OnDeleting alert's metric) follows a stop held up by a frozen service."""

from __future__ import annotations

import re
import signal
import subprocess

import httpx
import pytest

from tools.harness import REPO, System, free_port, unique, wait_for
from tools.infra.promtool import ensure_promtool
from tools.infra.system import InfraError

DEPLOY = REPO / "deploy"
NAME = re.compile(r"\borch_[a-z0-9_]+\b")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )", re.MULTILINE)


@pytest.fixture(scope="module")
def promtool() -> str:
    try:
        return str(ensure_promtool())
    except InfraError as exc:
        pytest.fail(f"cannot get promtool from Debian's prometheus package: {exc}")


def series_names(text: str) -> set[str]:
    return set(SAMPLE.findall(text))


def stopping_oldest(system: System) -> float:
    [line] = [x for x in system.get("/metrics").text.splitlines() if x.startswith("orch_observers_stopping_oldest")]
    return float(line.split()[1])


def test_the_rules_and_the_dashboard_query_metrics_a_real_manager_and_service_serve(
    system: System, promtool: str
) -> None:
    # Given a manager and a service serving /metrics, with observers started, one stopped
    system.start_manager()
    port = free_port()
    service = system.start_service("svc-a", workers=5, ORCH_METRICS_PORT=str(port))
    prefix = unique("alerts")
    created = [system.create(f"{prefix}-{i}", args={"interval_s": 0.2}) for i in range(3)]
    for o in created:
        system.wait_status(o["id"], "Processing")
    assert stopping_oldest(system) == 0.0

    # When a stop is asked of a frozen service, the oldest stop's wait grows; thawed, it ends
    service.signal(signal.SIGSTOP)
    try:
        assert system.delete(f"/api/observers/{created[0]['id']}").status_code == 202
        wait_for(lambda: stopping_oldest(system) >= 2.0, 20, "the oldest stop's wait to grow")
    finally:
        service.signal(signal.SIGCONT)
    system.wait_status(created[0]["id"], "Deleted")
    assert stopping_oldest(system) == 0.0

    # Then each answer passes promtool's checks
    manager_text = system.get("/metrics").text
    service_text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    for who, text in (("manager", manager_text), ("service", service_text)):
        check = subprocess.run(
            [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60, check=False
        )
        assert check.returncode == 0, f"promtool check metrics on the {who}'s /metrics:\n{check.stdout}{check.stderr}"

    # And every metric a rule or a panel queries is served by one of them
    served = series_names(manager_text) | series_names(service_text)
    for path in (DEPLOY / "prometheus" / "alerts.yml", DEPLOY / "grafana" / "orchestrator.json"):
        queried = {name for name in NAME.findall(path.read_text()) if name not in _FAMILIES_IN_PROSE}
        missing = queried - served
        assert not missing, f"{path.relative_to(REPO)} names metrics no /metrics serves: {sorted(missing)}"


# Histogram families named in the alerts' descriptions (their series carry a suffix).
_FAMILIES_IN_PROSE = {"orch_service_lease_round_trip_seconds"}
