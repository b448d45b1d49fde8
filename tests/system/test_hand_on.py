"""Quorum start and state queues carry their own hand-on timeout (issue 65; docs/design.md,
"How soon the starts of a dead node may move"): a dead node's deliveries move after 2 s whatever
the broker's ``consumer_disconnected_timeout``. A start queue an older release declared without
it keeps working as it is (a redeclare that adds the argument is refused), and the operator is
told once what to set. The seconds themselves are measured by ``python -m tools.node_death_fact``
and ``make bench-cluster``, not here."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared import topology
from tools import infra
from tools.harness import System


def queue_arguments(rabbit: infra.RabbitNode, vhost: str) -> dict[str, dict[str, object]]:
    said = rabbit.ctl("list_queues", "-p", vhost, "name", "arguments", "--formatter", "json")
    # Each argument is [name, AMQP type, value]
    return {q["name"]: {a[0]: a[2] for a in q["arguments"]} for q in json.loads(said[said.index("[") :])}


def declare_as_an_older_release(system: System, queue: str) -> None:
    """A quorum start queue as a release before the hand-on argument declared it."""
    declared_before: dict[str, Any] = {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": topology.DEAD_LETTER_EXCHANGE,
        "x-dead-letter-routing-key": queue,
        "x-delivery-limit": topology.NO_DELIVERY_LIMIT,
    }
    system.amqp(lambda channel: channel.declare_queue(queue, durable=True, arguments=declared_before))


def test_quorum_queues_hand_on_after_two_seconds_and_an_older_start_queue_keeps_working(
    system: System, rabbit: infra.RabbitNode, vhost: str
) -> None:
    if rabbit.install.series != "4.3":
        pytest.skip("x-consumer-disconnected-timeout exists from RabbitMQ 4.3.0; older series ignore it")
    older = topology.start_queue_name("older")
    declare_as_an_older_release(system, older)
    system.env["ORCH_QUEUE_TYPE"] = "quorum"
    manager = system.start_manager()
    service = system.start_service("svc-a", workers=5, ORCH_POOLS="default,older")

    # Both pools run what is created in them
    for name, pool in (("new", "default"), ("old", "older")):
        created = system.create(name, args={"interval_s": 0.5}, pool=pool)
        assert system.wait_status(created["id"], "Processing")["status"] == "Processing"

    arguments = queue_arguments(rabbit, vhost)
    for queue in (topology.start_queue_name("default"), topology.STATE_QUEUE):
        assert arguments[queue].get(topology.HAND_ON_ARGUMENT) == topology.HAND_ON_AFTER_MS, arguments[queue]
    assert topology.HAND_ON_ARGUMENT not in arguments[older], arguments[older]

    # Said once per process that declared it (the manager's API publishing, its state side
    # declaring before it tells the services, the service), naming the policy key that reaches it
    said = [
        line
        for proc in (manager, service)
        for line in proc.text().splitlines()
        if " ERROR " in line and f"queue {older} was declared before" in line
    ]
    assert said and all('"consumer-disconnected-timeout": 2000' in line for line in said), said
    sayers = [line.split(" ERROR [", 1)[1].split("]", 1)[0] for line in said]  # manager, manager:state, ...
    assert len(set(sayers)) == len(sayers) <= 3, said
    assert "Traceback" not in service.text() + manager.text()
