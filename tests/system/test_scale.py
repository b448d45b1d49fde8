"""One service holding more starts than one consumer may (prefetch_count is 16-bit: at
most 65,535 unacked per consumer): 100,000 in one service, held by consumers of at most
``HOLD_PER_CHANNEL`` each, each on a channel of its own (RabbitMQ's cost of settling a
delivery grows with how many its channel holds)."""

from __future__ import annotations

import re

from observer_service.session import HOLD_PER_CHANNEL
from shared import topology
from tools import infra
from tools.harness import System, wait_for

N = 100_000


def test_one_service_holds_100000_observers(system: System, rabbit: infra.RabbitNode, vhost: str) -> None:
    # Given one service of 100,000 workers
    system.start_manager()
    svc = system.start_service("svc-big", workers=N, ORCH_INVENTORY_S="30")

    # When 100,000 idle observers are created (100 bulk requests of 1,000)
    for start in range(0, N, 1_000):
        batch = [
            {"name": f"big-{i}", "kind": "ticker", "args": {"interval_s": 3600, "emit": False}}
            for i in range(start, start + 1_000)
        ]
        response = system.post("/api/observers/bulk", {"observers": batch})
        assert response.status_code == 201, response.text

    # Then all run on it, held by consumers of at most HOLD_PER_CHANNEL on channels of their own
    wait_for(
        lambda: system.get("/api/stats").json()["observers"]["Processing"] == N, 600, "100,000 Processing", every=2
    )
    queue = topology.start_queue_name("default")
    listing = rabbit.ctl(
        "-q", "list_queues", "--no-table-headers", "-p", vhost, "name", "messages_ready", "messages_unacknowledged"
    )
    ready, unacked = next(
        (int(r), int(u)) for name, r, u in (line.split("\t") for line in listing.splitlines()) if name == queue
    )
    assert (ready, unacked) == (0, N)
    listing = rabbit.ctl(
        "-q", "list_consumers", "--no-table-headers", "-p", vhost, "queue_name", "channel_pid", "prefetch_count"
    )
    consumers = [(c, int(p)) for q, c, p in (line.split("\t") for line in listing.splitlines()) if q == queue]
    assert sum(p for _, p in consumers) == N
    assert max(p for _, p in consumers) == HOLD_PER_CHANNEL
    assert len({c for c, _ in consumers}) == len(consumers) == -(-N // HOLD_PER_CHANNEL)
    service = system.service_by_name("svc-big")
    assert service is not None and service["running"] == N
    assert not re.search(r"broker session lost|fenced", svc.text())
