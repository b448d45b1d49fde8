"""Starts the emptiest service cannot run reach one that can (issue 62; docs/design.md, "Starts a
service cannot run"), with real services whose capabilities differ: one has process slots and
one has none, or one has the test plug-in's kinds and one has not. In each, the balancer makes
the service that cannot run them the emptiest (consumer priority 2), so the broker offers it
every new start first.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest
from aio_pika.abc import AbstractQueue

from observer_service.service import ObserverService
from observer_service.session import Session
from observer_service.settings import ServiceSettings
from shared.messages import ServiceHeartbeat, SetPlacement, decode_state
from tests.system.test_fencing import assert_never_on_two_services
from tools import infra
from tools.harness import System, probe_args, wait_for

QUEUE = "orch.start.default"


@pytest.fixture
def balanced(system: System) -> None:
    """The balancer on at its default pace (it sets the priorities), and the lost-start repair
    quick to act, so that a second copy of a start would be published within the tests."""
    system.env["ORCH_BALANCE_MOVES_PER_S"] = "250"
    system.env["ORCH_LOST_START_AFTER_S"] = "2"


def priorities(rabbit: infra.RabbitNode, vhost: str) -> list[int]:
    """The consumer priorities of the start queue's consumers, as the broker has them."""
    out = rabbit.ctl("list_consumers", "-p", vhost, "-q", "--no-table-headers", "queue_name", "arguments")
    found = (re.search(r'"x-priority",(-?\d+)', line) for line in out.splitlines() if line.startswith(QUEUE + "\t"))
    return sorted(int(m.group(1)) for m in found if m)


def start_messages(rabbit: infra.RabbitNode, vhost: str) -> int:
    """The start messages in the start queue, ready or held: one per live observer."""
    out = rabbit.ctl("list_queues", "-p", vhost, "-q", "--no-table-headers", "name", "messages")
    return next(int(line.split("\t")[1]) for line in out.splitlines() if line.startswith(QUEUE + "\t"))


def pinned(system: System, prefix: str, count: int, **spec: Any) -> None:
    specs = [{"name": f"{prefix}-{i}", "rebalance": False} | spec for i in range(count)]
    response = system.post("/api/observers/bulk", {"observers": specs})
    assert response.status_code == 201, response.text


def service_of(system: System, observer_id: str) -> str | None:
    names = {s["id"]: s["name"] for s in system.services()}
    obs = system.observer(observer_id)
    return names.get(obs["service_id"]) if obs["status"] == "Processing" else None


def declined_by(system: System, observer_id: str) -> list[tuple[str, str]]:
    names = {s["id"]: s["name"] for s in system.services()}
    events = system.get(f"/api/observers/{observer_id}/events").json()
    return [(names[e["service_id"]], e["detail"]) for e in events if e["event"] == "declined"]


@pytest.mark.usefixtures("balanced")
def test_process_starts_reach_the_service_with_slots_and_wait_as_one_copy_when_none_is_free(
    with_test_plugin: System, tmp_path: Path, rabbit: infra.RabbitNode, vhost: str
) -> None:
    system = with_test_plugin
    ticks = tmp_path / "ticks.log"
    system.start_manager()
    system.start_service("slots", workers=60, ORCH_PROCESS_SLOTS="4")
    pinned(system, "busy", 50, kind="ticker", args={"interval_s": 5})
    wait_for(lambda: len(system.observers(status="Processing")) == 50, 30, "50 Processing")
    system.start_service("bare", workers=60, ORCH_PROCESS_SLOTS="0")
    wait_for(lambda: priorities(rabbit, vhost) == [0, 2], 30, "the empty service placed first")

    # Three observers that need a child process: the empty service has no slot for them
    made = [system.create(f"proc-{i}", kind="probe", args=probe_args(ticks), isolation="process") for i in range(3)]
    wait_for(lambda: all(service_of(system, o["id"]) == "slots" for o in made), 20, "all three running on slots")
    # The first went to the empty service, which declined it and stepped aside for the others
    said = [d for o in made for d in declined_by(system, o["id"])]
    assert ("bare", "bare: it has no process slots (ORCH_PROCESS_SLOTS=0)") in said, said

    # Two more: one takes the last slot, the other waits, as one start, while both decline it
    more = [system.create(f"wait-{i}", kind="probe", args=probe_args(ticks), isolation="process") for i in range(2)]
    wait_for(lambda: sum(service_of(system, o["id"]) == "slots" for o in more) == 1, 20, "the fourth slot taken")
    waiting = next(o for o in more if service_of(system, o["id"]) is None)
    time.sleep(8)  # four times the lost-start repair's wait
    row = system.observer(waiting["id"])
    assert row["status"] == "Created" and row["service_id"] is None
    assert {name for name, _ in declined_by(system, waiting["id"])} == {"bare", "slots"}
    assert start_messages(rabbit, vhost) == 55  # no second copy of the waiting start

    # A slot freed: the waiting one runs there, and still no copy was made
    assert system.delete(f"/api/observers/{made[0]['id']}").status_code == 202
    wait_for(lambda: service_of(system, waiting["id"]) == "slots", 30, "the waiting one running in the freed slot")
    wait_for(lambda: start_messages(rabbit, vhost) == 54, 10, "54 starts for 54 live observers")
    assert_never_on_two_services(ticks)


@pytest.mark.usefixtures("balanced")
def test_starts_of_a_kind_one_service_lacks_reach_the_one_that_has_it_and_are_not_moved_to_it(
    system: System, plugin_path: Path, tmp_path: Path, rabbit: infra.RabbitNode, vhost: str
) -> None:
    ticks = tmp_path / "ticks.log"
    system.start_manager()
    system.start_service("plugged", workers=60, PYTHONPATH=str(plugin_path))
    pinned(system, "busy", 50, kind="probe", args=probe_args(ticks, 1.0))
    wait_for(lambda: len(system.observers(status="Processing")) == 50, 30, "50 Processing")
    system.start_service("bare", workers=60)
    wait_for(lambda: priorities(rabbit, vhost) == [0, 2], 30, "the service without the plug-in placed first")

    made = [system.create(f"probe-{i}", kind="probe", args=probe_args(ticks)) for i in range(10)]
    wait_for(lambda: all(service_of(system, o["id"]) == "plugged" for o in made), 20, "all ten running on plugged")
    assert any(
        name == "bare" and "'probe' is not installed here" in detail
        for name, detail in declined_by(system, made[0]["id"])
    )

    # The balancer sees plugged over and bare under, but moves nothing bare cannot run
    time.sleep(5)
    assert all(service_of(system, o["id"]) == "plugged" for o in made)
    events = [e["event"] for o in made for e in system.get(f"/api/observers/{o['id']}/events").json()]
    assert "rebalanced" not in events and "released" not in events, events
    assert start_messages(rabbit, vhost) == 60
    assert_never_on_two_services(ticks)


async def test_a_placement_told_while_a_session_opens_is_applied_and_heartbeats_say_what_is_consumed(
    rabbit: infra.RabbitNode, vhost: str, state_queue: AbstractQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real service, in this process, against the real broker: a cordon arrives while its
    session opens (its control queue is consumed before the open returns). Before issue 62 the
    consumers kept the placement they opened with, and heartbeats reported the new one, so the
    balancer saw agreement and never sent it again: a drained service kept taking starts."""
    settings = ServiceSettings(
        amqp_url=rabbit.url_for(vhost), workers_count=5, service_name="racy", heartbeat_s=0.2, metrics_port=0
    )
    service = ObserverService(settings)
    real_open = Session.open

    async def open_then_cordoned(self: Session, *args: Any) -> None:
        await real_open(self, *args)
        service._on_control(SetPlacement(service_id=service.service_id, priority=1, cordoned=True))

    monkeypatch.setattr(Session, "open", open_then_cordoned)
    running = asyncio.create_task(service.run())
    try:
        # The heartbeats say cordoned only once the start queue has no consumer left
        async with asyncio.timeout(20):
            while True:
                message = await state_queue.get(no_ack=True, fail=False)
                if message is None:
                    await asyncio.sleep(0.05)
                    continue
                beat = decode_state(message.body)
                if isinstance(beat, ServiceHeartbeat) and beat.cordoned:
                    break
        assert await asyncio.to_thread(priorities, rabbit, vhost) == []
    finally:
        service.shutdown.set()
        await asyncio.wait_for(running, 30)
