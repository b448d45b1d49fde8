"""A refusal that retrying cannot heal is said once, clearly (issue 53).

A broker that refuses a service for good (a queue argument or type it rejects, a permission,
the credentials, a deprecated feature it denies) used to get a WARNING with the broker's raw
text at every attempt, several a second, for ever, and the service looked alive and well. Now
the service says it as one ERROR naming what to change, at most once a minute, counts it in
its metrics, keeps its session for what the broker does take, and tells the manager, whose
``GET /api/services`` and ``/readyz`` show it; fixing the cause heals it without a restart.
"""

from __future__ import annotations

import re

import httpx

from tools import infra
from tools.harness import System, free_port, wait_for

REFUSED_POOL = "picky"


def service_metric(port: int, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", httpx.get(f"http://127.0.0.1:{port}/metrics").text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def errors(text: str, what: str) -> list[str]:
    return [line for line in text.splitlines() if " ERROR " in line and what in line]


def test_a_start_queue_the_broker_refuses_is_said_once_shown_and_healed(
    system: System, rabbit: infra.RabbitNode, vhost: str
) -> None:
    # An operator's queue of that name with other arguments: every declare of ours gets 406
    queue = f"orch.start.{REFUSED_POOL}"
    system.amqp(lambda channel: channel.declare_queue(queue, durable=True, arguments={"x-max-length": 10}))
    system.start_manager()
    port = free_port()
    service = system.start_service(
        "svc-a", workers=5, ORCH_POOLS=f"default,{REFUSED_POOL}", ORCH_METRICS_PORT=str(port), ORCH_REFUSED_RETRY_S="3"
    )
    refused = "cannot consume pool picky: PRECONDITION_FAILED - inequivalent arg"
    wait_for(lambda: errors(service.text(), refused), 30, "the service to say what is refused")
    assert "the broker refuses a queue's arguments or type" in errors(service.text(), refused)[0]

    # The manager shows it: the service is alive but not well, and the manager stays ready
    def shown() -> str | None:
        row = system.service_by_name("svc-a")
        return row["refused"] if row else None

    wait_for(lambda: (shown() or "").startswith("pool picky: PRECONDITION_FAILED"), 30, "GET /api/services")
    ready = system.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "degraded", ready.text
    assert "svc-a cannot consume: pool picky" in ready.json()["services"]
    assert service_metric(port, "orch_service_refused") == 1.0

    # The pool the broker takes still works
    fine = system.create("fine", args={"interval_s": 0.5})
    system.wait_status(fine["id"], "Processing")

    # Retried (every 3 s here) but said once a minute at most
    wait_for(lambda: service_metric(port, "orch_service_refusals_total") >= 3, 60, "more attempts")
    assert len(errors(service.text(), refused)) == 1, service.text()[-3000:]

    # Fixed by the operator: the next attempt consumes, and every view clears
    rabbit.ctl("delete_queue", "-p", vhost, queue)
    wait_for(lambda: "takes the start queue of pool picky again" in service.text(), 45, "the pool consumed again")
    wait_for(lambda: shown() is None, 30, "the refusal to clear in GET /api/services")
    assert system.get("/readyz").json()["status"] == "ok"
    assert service_metric(port, "orch_service_refused") == 0.0
    picky = system.create("in-picky", args={"interval_s": 0.5}, pool=REFUSED_POOL)
    system.wait_status(picky["id"], "Processing")
    assert "Traceback" not in service.text()


def test_credentials_the_broker_refuses_are_said_once_a_minute(system: System) -> None:
    wrong = re.sub(r"//([^:]+):[^@]+@", r"//\1:not-the-password@", system.amqp_url)
    port = free_port()
    service = system.start_service("svc-a", workers=5, wait=False, ORCH_AMQP_URL=wrong, ORCH_METRICS_PORT=str(port))
    said = "cannot open a broker session: ACCESS_REFUSED"
    # WARNINGs for the first seconds (a broker rebuilding its vhost refuses for a moment),
    # then one ERROR a minute
    wait_for(lambda: errors(service.text(), said), 60, "the service to name the credentials")
    assert "the user and password in the AMQP URL" in errors(service.text(), said)[0]
    attempts = service_metric(port, "orch_service_refusals_total")
    wait_for(lambda: service_metric(port, "orch_service_refusals_total") >= attempts + 3, 30, "more attempts")
    assert len(errors(service.text(), said)) == 1, service.text()[-3000:]
    assert service_metric(port, "orch_service_refused") == 1.0
