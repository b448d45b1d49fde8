"""A service on a cluster reads the broker's ``net_ticktime`` and keeps its lease's give-up
bound under what that allows (issue 65: a setting no queue argument carries is checked at
start; docs/design.md, "How soon the starts of a dead node may move").

A real node of the series under test with RabbitMQ's own Prometheus plugin and ``net_ticktime = 5``: the majority
of a cluster could hand a cut-off node's starts on 0.75 x 5 + 2 = 5.75 s after the cut, so
``ORCH_LEASE_GIVE_UP_S=6`` would let a cut-off session outlive that. The service must lower
the bound to 4.5 s (a second and a renewal period to spare), say so, and end a session whose
lease stays unrenewed (the node frozen) at that bound, not at 6 s.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import httpx

from tools import infra
from tools.harness import System, free_port, unique, wait_for


def test_a_short_net_ticktime_lowers_the_give_up_a_session_ends_at(tmp_path: Path) -> None:
    node = infra.RabbitNode(
        name=unique("orch-ticktime"),
        base=tmp_path / "rabbitmq",
        port=free_port(),
        dist_port=free_port(),
        user="orch",
        password="test-password",
        prometheus_port=free_port(),
        extra_conf="net_ticktime = 5",
    )
    system = System(amqp_url=node.url, database_url="unused", workdir=tmp_path)
    frozen: int | None = None
    try:
        node.start()
        metrics_port = free_port()
        service = system.start_service(
            "ticktime",
            ORCH_QUEUE_TYPE="quorum",
            ORCH_LEASE_GIVE_UP_S="6",
            ORCH_BROKER_METRICS_URLS=node.metrics_url,
            ORCH_METRICS_PORT=str(metrics_port),
        )
        wait_for(lambda: "broker session open on" in service.text(), 60, "the service's session", every=0.5)
        log = service.text()
        assert "lease give-up lowered from ORCH_LEASE_GIVE_UP_S=6 to 4.50 s: net_ticktime 5 s" in log, log
        assert log.index("lease give-up lowered") < log.index("broker session open on")
        page = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert "orch_service_lease_give_up_seconds 4.5" in page

        frozen = node.live_pid()
        assert frozen is not None
        os.kill(frozen, signal.SIGSTOP)
        ended = wait_for(
            lambda: re.search(r"lease unrenewed for (\d+)s", service.text()), 30, "the session to give up", every=0.2
        )
        assert ended is not None and int(ended.group(1)) < 6, service.text()
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        system.stop_all()
        node.destroy()
