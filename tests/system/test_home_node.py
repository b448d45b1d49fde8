"""A service returns to its home node once the node is back (issue 65).

Every service is given the same node list, as a Kubernetes Secret gives it: each starts at
the node its name picks (``ORCH_AMQP_HOME=by-name``), so they spread over the cluster. The
home node of one is killed: it moves to another node and its observers run on. The node
comes back: after ``ORCH_AMQP_RETURN_HOME_AFTER_S`` (2 s here, times 1 to 2) of confirmed
writes the service hands its observers over and opens its next session at home. Nothing is
lost and nothing runs on two services at once, before, during or after the return."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.broker_nodes import BrokerNodes
from tests.system.test_cluster import Fleet, fleet_on_cluster, room, ticking_since
from tests.system.test_fencing import assert_never_on_two_services
from tools.harness import probe_args, wait_for

COUNT = 30


@pytest.fixture
def fleet(database: str, plugin_path: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    yield from fleet_on_cluster(database, plugin_path, tmp_path, request)


def named_for_each_node(urls: list[str]) -> list[str]:
    """A service name whose home is each node, in the nodes' order."""
    names: dict[int, str] = {}
    for i in itertools.count():
        name = f"svc-{i}"
        names.setdefault(BrokerNodes(urls, home_key=name).home, name)
        if len(names) == len(urls):
            return [names[at] for at in range(len(urls))]
    raise AssertionError("unreachable")


def test_a_service_spreads_by_name_and_returns_home_once_its_node_is_back(fleet: Fleet, tmp_path: Path) -> None:
    system, nodes = fleet.system, fleet.nodes
    system.env |= {"ORCH_AMQP_HOME": "by-name", "ORCH_AMQP_RETURN_HOME_AFTER_S": "2"}
    system.start_manager()
    names = named_for_each_node(fleet.urls)
    services = [system.start_service(name, workers=room(COUNT)) for name in names]
    # One list for all, and each opened its session at its own node
    for service, node in zip(services, nodes, strict=True):
        assert f"broker session open on 127.0.0.1:{node.port}" in service.text(), service.text()[-2000:]
    ticks = tmp_path / "ticks.log"
    ids = [system.create(f"h-{i}", kind="probe", args=probe_args(ticks, 0.2))["id"] for i in range(COUNT)]
    wait_for(lambda: fleet.all_processing_on_alive(ids), 120, "all Processing")

    node, victim = nodes[2], services[2]  # not the manager's node
    home = f"broker session open on 127.0.0.1:{node.port}"
    killed_at = time.time()
    node.kill()
    try:
        wait_for(lambda: victim.text().count("broker session open on") >= 2, 60, f"{victim.name} to move")
        assert victim.text().count(home) == 1
        wait_for(lambda: ticking_since(ticks, ids, killed_at + 1), 90, "all running again while the node is down")
    finally:
        node.start()
    back = f"moving back to home broker node 127.0.0.1:{node.port}"
    wait_for(lambda: back in victim.text() and victim.text().count(home) == 2, 120, f"{victim.name} back home")
    returned_at = time.time()
    wait_for(lambda: ticking_since(ticks, ids, returned_at + 1), 90, "all running after the return")
    wait_for(lambda: fleet.all_processing_on_alive(ids), 60, "all Processing after the return")
    assert victim.alive()
    assert_never_on_two_services(ticks)
