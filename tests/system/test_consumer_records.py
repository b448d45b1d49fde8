"""A service's consumers of a quorum start queue stay one record per channel in the queue through
placement changes (RabbitMQ 4 on; docs/design.md, "Placement by consumer priority").

A quorum queue keeps a cancelled consumer's record while it holds deliveries, and a service
consumes again at every new priority while its observers run on: under a new tag each time, a
record stayed per placement change for as long as those observers ran, and the queue walks
every record to find one by tag. Here a service holds twelve pinned observers (never moved)
while the balancer moves its priority as a second service joins and takes creates: the queue
must keep exactly the consumers the broker lists, and no start may run beyond the workers.
"""

from __future__ import annotations

import pytest

from tests.system.test_consumer_priority import _fifo_consumers
from tests.system.test_placement import pinned, priorities
from tools import infra
from tools.harness import System, wait_for

QUEUE = "orch.start.default"


def listed_consumers(rabbit: infra.RabbitNode, vhost: str, queue: str = QUEUE) -> int:
    """The live consumers of ``queue``: on a quorum queue, a declare's consumer count also
    counts the cancelled records that still hold deliveries (``rabbit_fifo``'s
    ``query_consumer_count``), which ``list_consumers`` leaves out (``query_consumers``)."""
    out = rabbit.ctl("list_consumers", "-p", vhost, "-q", "--no-table-headers", "queue_name")
    return sum(line.strip() == queue for line in out.splitlines())


def test_placement_changes_leave_one_record_per_channel_in_a_quorum_start_queue(
    system: System, rabbit: infra.RabbitNode, vhost: str
) -> None:
    if rabbit.install.series == "3.10":
        pytest.skip("3.10 cannot take a record up (test_consumer_priority.py): each consume keeps a new tag")
    system.env |= {"ORCH_QUEUE_TYPE": "quorum", "ORCH_BALANCE_MOVES_PER_S": "250"}
    system.start_manager()
    system.start_service("svc-a", workers=20)
    pinned(system, "held", 12, kind="ticker", args={"interval_s": 5})
    wait_for(lambda: len(system.observers(status="Processing")) == 12, 30, "12 Processing on svc-a")

    system.start_service("svc-b", workers=20)
    wait_for(lambda: priorities(rabbit, vhost) == [0, 2], 30, "svc-a placed below the new service")
    for i in range(14):
        system.create(f"new-{i}", args={"interval_s": 5})
    wait_for(lambda: len(system.observers(status="Processing")) == 26, 30, "26 Processing")
    wait_for(lambda: priorities(rabbit, vhost) in ([1, 1], [0, 2], [2, 0]), 30, "a placement after the creates")

    # Every placement change consumed again while svc-a held its twelve: still one record each
    assert _fifo_consumers(rabbit, vhost, QUEUE) == listed_consumers(rabbit, vhost) == 2
    by_service: dict[str, int] = {}
    for obs in system.observers(status="Processing"):
        by_service[obs["service_id"]] = by_service.get(obs["service_id"], 0) + 1
    assert max(by_service.values()) <= 20, by_service
