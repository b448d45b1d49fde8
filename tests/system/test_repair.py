"""Garbage and lost messages: dead-lettered, repaired by inventories, duplicates removed.
(Issue #2 tests 14 and 15.)"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import aio_pika
import pytest

from shared import topology
from shared.messages import StartObserver
from tools.harness import System, metric, probe_args, read_ticks, wait_for


def test_garbage_is_dead_lettered_and_consumers_keep_working(system: System) -> None:
    system.start_manager()
    service = system.start_service("svc-a", workers=3)

    system.publish_raw(topology.STATE_QUEUE, b"not json at all")
    system.publish_raw(topology.STATE_QUEUE, json.dumps({"type": "ServiceBorn", "bogus": 1}).encode())
    system.publish_raw(topology.start_queue_name("default"), b"\x00\x01garbage")
    system.publish_raw(topology.start_queue_name("default"), json.dumps({"type": "StartObserver"}).encode())

    state_errors = topology.error_queue_name(topology.STATE_QUEUE)
    start_errors = topology.error_queue_name(topology.start_queue_name("default"))
    wait_for(lambda: system.queue_counts(state_errors)[0] == 2, 20, "state garbage dead-lettered")
    wait_for(lambda: system.queue_counts(start_errors)[0] == 2, 20, "start garbage dead-lettered")
    assert system.manager is not None
    assert "dead-lettering a malformed state message" in system.manager.text()
    assert "dead-lettering a malformed start message" in service.text()

    # Both consumers keep going
    created = system.create("after-garbage", args={"interval_s": 0.2})
    system.wait_status(created["id"], "Processing")
    assert system.manager.alive() and service.alive()


def test_inventory_repairs_a_lost_observer_started(system: System) -> None:
    manager = system.start_manager()
    a = system.start_service("svc-a", workers=3)
    created = system.create("repaired", args={"interval_s": 0.2})
    system.wait_status(created["id"], "Processing")
    dead = system.service_by_name("svc-a")
    assert dead is not None

    # While the manager is down the observer moves, and its start report is lost
    manager.kill9()
    system.start_service("svc-b", workers=3, wait=False)
    wait_for(lambda: "broker session open" in system.procs[-1].text(), 30, "svc-b up")
    a.kill9()
    wait_for(lambda: "redelivered=True" in system.procs[-1].text(), 30, "moved to svc-b")
    # The report may still linger in svc-b's outbox for a moment after the log line.
    wait_for(lambda: drop_state_messages(system, "ObserversStarted"), 10, "svc-b's start report to be dropped")

    # Then the next inventory of svc-b tells the manager where it runs
    system.start_manager()
    observer = wait_for(
        lambda: (o := system.observer(created["id"]))["service_name"] == "svc-b" and o, 30, "repaired service"
    )
    assert observer["status"] == "Processing"


def test_a_steady_fleet_sends_digests_that_match_not_inventories(system: System) -> None:
    # Given two services running 30 observers, each sending a digest every 3 s
    system.start_manager()
    for name in ("svc-a", "svc-b"):
        system.start_service(name, workers=20)
    ids = [system.create(f"steady-{i}", args={"emit": False})["id"] for i in range(30)]
    for oid in ids:
        system.wait_status(oid, "Processing")
    before = metric(system, "orch_inventory_digests_total")

    # When several periods pass
    wait_for(lambda: metric(system, "orch_inventory_digests_total") >= before + 6, 30, "digests compared")

    # Then every digest matched the rows (computed by PostgreSQL), so no inventory was asked for
    assert metric(system, "orch_inventory_digest_mismatches_total") == 0


def drop_state_messages(system: System, message_type: str) -> int:
    """Take every message out of the state queue and put back all but ``message_type``. Taken
    by a consumer, not ``basic.get``: a quorum state queue (single active consumer) refuses
    a get (RESOURCE_LOCKED), and with the manager down this consumer is the active one."""

    async def filter_queue(channel: aio_pika.abc.AbstractChannel) -> int:
        await channel.set_qos(prefetch_count=1)  # nothing past the ones waiting now is taken
        queue = await channel.declare_queue(topology.STATE_QUEUE, passive=True)
        kept: list[bytes] = []
        dropped = 0
        waiting = queue.declaration_result.message_count or 0  # heartbeats keep coming: only these
        async with queue.iterator() as messages:
            for _ in range(waiting):
                message = await asyncio.wait_for(messages.__anext__(), 10.0)
                if json.loads(message.body).get("type") == message_type:
                    dropped += 1
                else:
                    kept.append(message.body)
                await message.ack()
        for body in kept:
            await channel.default_exchange.publish(topology.persistent(body), routing_key=topology.STATE_QUEUE)
        return dropped

    return system.amqp(filter_queue)


@pytest.mark.usefixtures("with_test_plugin")
def test_duplicate_start_message_ends_with_one_service(system: System, tmp_path: Path) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=1)
    log = tmp_path / "t.log"
    created = system.create("single", kind="probe", args=probe_args(log, 0.1))
    first = system.wait_status(created["id"], "Processing")
    b = system.start_service("svc-b", workers=3)

    # A second start message for the running observer (svc-a is full: it goes to svc-b)
    duplicate = StartObserver(
        observer_id=uuid.UUID(created["id"]),
        name="single",
        kind="probe",
        args=probe_args(log, 0.1),
    )
    system.publish_raw(topology.start_queue_name("default"), duplicate.encode())
    wait_for(lambda: "(probe single) started" in b.text(), 20, "the duplicate to start on svc-b")

    # The manager stops the copy (targeted at svc-b): afterwards only the original service ticks
    wait_for(lambda: "stopped (duplicate start message)" in b.text(), 20, "the copy stopped")

    def settled() -> bool:
        recent = [t for t in read_ticks(log) if t[3] > max(t[3] for t in read_ticks(log)) - 1.5]
        return {t[1] for t in recent} == {first["service_id"]}

    time.sleep(2)
    wait_for(settled, 30, "one service left")
    assert system.observer(created["id"])["service_id"] == first["service_id"]
    assert system.queue_counts(topology.start_queue_name("default"))[0] == 0
