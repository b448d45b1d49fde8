"""A broker of several nodes (``ORCH_AMQP_URLS``): a node that is down is skipped, and when
the node in use goes away the manager and the services move to the next one and everything
runs again. The nodes here are relays to one broker (``tools/partition.py``): closing a relay
is what a node's death looks like to a client (its connections reset, new ones refused)."""

from __future__ import annotations

import socket

from tools.harness import System, wait_for
from tools.partition import Partition


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node_url(amqp_url: str, port: int) -> str:
    scheme, rest = amqp_url.split("://", 1)
    credentials, _, location = rest.rpartition("@")
    return f"{scheme}://{credentials}@127.0.0.1:{port}/{location.partition('/')[2]}"


def test_a_node_that_is_down_is_skipped(system: System) -> None:
    urls = f"{_node_url(system.amqp_url, _closed_port())},{system.amqp_url}"
    system.start_manager(ORCH_AMQP_URLS=urls)
    service = system.start_service("svc-a", workers=5, ORCH_AMQP_URLS=urls, ORCH_AMQP_HOME="first")
    oid = system.create("on-the-second-node", args={"interval_s": 0.5})["id"]
    system.wait_status(oid, "Processing")
    assert "broker session open on 127.0.0.1:" in service.text()


def test_the_node_in_use_goes_away_and_everything_moves_to_the_next(system: System) -> None:
    with Partition.before(system.amqp_url) as node:
        urls = f"{node.url_for(system.amqp_url)},{system.amqp_url}"
        manager = system.start_manager(ORCH_AMQP_URLS=urls)
        services = [
            system.start_service(name, workers=20, ORCH_AMQP_URLS=urls, ORCH_AMQP_HOME="first")
            for name in ("svc-a", "svc-b")
        ]
        ids = [system.create(f"o-{i}", args={"interval_s": 0.2})["id"] for i in range(20)]
        for oid in ids:
            system.wait_status(oid, "Processing")
        assert all(f"broker session open on 127.0.0.1:{node.port}" in s.text() for s in services)
        # Every connection so far went through the first node: the manager's, its state
        # process's and probes', and two per service.
        assert node.connections >= 5
    # The first node died: its connections reset, new ones refused.
    broker_port = system.amqp_url.rpartition("@")[2].split("/")[0].rpartition(":")[2]
    wait_for(
        lambda: all(f"broker session open on 127.0.0.1:{broker_port}" in s.text() for s in services),
        60,
        "both services to open a session on the second node",
    )
    wait_for(lambda: f"at 127.0.0.1:{broker_port}" in manager.text(), 60, "the manager to reconnect to it")
    for oid in ids:
        system.wait_status(oid, "Processing", timeout=60)
    # Creates and stops work through the second node
    late = system.create("after-the-move", args={"interval_s": 0.2})["id"]
    system.wait_status(late, "Processing", timeout=60)
    assert system.delete(f"/api/observers/{ids[0]}").status_code == 202
    system.wait_status(ids[0], "Deleted", timeout=60)
