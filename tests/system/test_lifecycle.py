"""Create, list, stop: the happy path and the API's answers to bad requests.
(Issue #2 tests 1-4.)"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import aio_pika
import pytest

from shared import topology
from tools.harness import System, probe_args, read_ticks, wait_for


@pytest.mark.usefixtures("with_test_plugin")
def test_create_runs_on_a_live_service_and_is_visible(system: System, tmp_path: Path) -> None:
    # Given a manager and one service, and a queue listening to the observers' events
    system.start_manager()
    system.start_service("svc-a", workers=5)

    async def bind(channel: aio_pika.abc.AbstractChannel) -> None:
        queue = await channel.declare_queue("test.events", durable=True)
        await queue.bind(topology.EVENTS_EXCHANGE, routing_key="probe.#")

    system.amqp(bind)

    # When an observer is created
    created = system.create("watch-1", kind="probe", args=probe_args(tmp_path / "ticks.log"))
    assert created["status"] in ("Created", "Processing")

    # Then it is Processing on the live service, everywhere the API shows it
    obs = system.wait_status(created["id"], "Processing")
    assert obs["service_name"] == "svc-a"
    listed = system.get("/api/observers", status="Processing").json()["items"]
    assert [o["id"] for o in listed] == [created["id"]]
    stats = system.get("/api/stats").json()
    assert stats["observers"]["Processing"] == 1
    assert stats["capacity"]["default"] == {"total": 5, "used": 1, "free": 4}
    services = system.services()
    assert services[0]["name"] == "svc-a" and services[0]["running"] == 1

    # And its body really runs: ticks in its file and events on the exchange
    wait_for(lambda: len(read_ticks(tmp_path / "ticks.log")) >= 3, 15, "three ticks")

    async def one_event(channel: aio_pika.abc.AbstractChannel) -> dict[str, object]:
        queue = await channel.declare_queue("test.events", passive=True)
        for _ in range(50):
            message = await queue.get(fail=False)
            if message is not None:
                await message.ack()
                body: dict[str, object] = json.loads(message.body)
                return body
            await __import__("asyncio").sleep(0.1)
        raise AssertionError("no event published")

    event = system.amqp(one_event)
    assert event["observer_id"] == created["id"] and event["kind"] == "probe"
    assert event["service_id"] == obs["service_id"]


def test_bad_requests_get_clear_errors(system: System) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=2)
    first = system.create("dup", args={"interval_s": 0.2})

    duplicate = system.post("/api/observers", {"name": "dup", "kind": "ticker"})
    assert duplicate.status_code == 409 and "dup" in duplicate.json()["detail"]

    unknown_kind = system.post("/api/observers", {"name": "x1", "kind": "no-such-kind"})
    assert unknown_kind.status_code == 422 and "no-such-kind" in unknown_kind.json()["detail"]

    bad_args = system.post("/api/observers", {"name": "x2", "kind": "ticker", "args": {"interval_s": -1}})
    assert bad_args.status_code == 422 and "interval_s" in bad_args.json()["detail"]

    bad_body = system.post("/api/observers", {"kind": "ticker"})
    assert bad_body.status_code == 422 and "name" in bad_body.json()["detail"]

    missing = system.get(f"/api/observers/{uuid.uuid4()}")
    assert missing.status_code == 404 and "no observer" in missing.json()["detail"]
    assert system.delete(f"/api/observers/{uuid.uuid4()}").status_code == 404

    system.create("second", args={"interval_s": 0.2})
    full = system.post("/api/observers", {"name": "third", "kind": "ticker"})
    assert full.status_code == 503 and "full" in full.json()["detail"]

    system.wait_status(first["id"], "Processing")
    assert system.delete(f"/api/observers/{first['id']}").status_code == 202
    system.wait_status(first["id"], "Deleted")
    again = system.delete(f"/api/observers/{first['id']}")
    assert again.status_code == 409 and "Deleted" in again.json()["detail"]

    # Nothing half-made was left behind by the refused requests
    assert {o["name"] for o in system.observers()} == {"dup", "second"}


@pytest.mark.usefixtures("with_test_plugin")
def test_stop_cancels_the_body_and_removes_the_start_message(system: System, tmp_path: Path) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=3)
    created = system.create("to-stop", kind="probe", args=probe_args(tmp_path / "ticks.log", 0.1))
    system.wait_status(created["id"], "Processing")
    wait_for(lambda: len(read_ticks(tmp_path / "ticks.log")) >= 2, 15, "ticks")

    response = system.delete(f"/api/observers/{created['id']}")
    assert response.status_code == 202 and response.json()["status"] == "OnDeleting"
    # A repeated stop is accepted unchanged while OnDeleting, refused once Deleted
    assert system.delete(f"/api/observers/{created['id']}").status_code in (202, 409)
    system.wait_status(created["id"], "Deleted")

    # The body saw cancellation: it ticks no more
    count = len(read_ticks(tmp_path / "ticks.log"))
    time.sleep(1.0)
    assert len(read_ticks(tmp_path / "ticks.log")) == count
    # And the start message was acked: nothing ready, nothing held by the consumer
    assert system.queue_counts(topology.start_queue_name("default"))[0] == 0
    service = system.service_by_name("svc-a")
    assert service is not None
    wait_for(lambda: system.get(f"/api/services/{service['id']}").json()["running"] == 0, 10, "running 0")


@pytest.mark.usefixtures("with_test_plugin")
def test_stop_of_a_created_observer_while_no_service_runs(system: System, tmp_path: Path) -> None:
    # Given an observer whose only service left (handing it back to the queue)
    system.start_manager()
    svc = system.start_service("svc-a", workers=3)
    created = system.create("orphan", kind="probe", args=probe_args(tmp_path / "ticks.log", 0.1))
    system.wait_status(created["id"], "Processing")
    assert svc.terminate() == 0
    system.wait_status(created["id"], "Created")

    # When it is stopped while no service runs
    assert system.delete(f"/api/observers/{created['id']}").status_code == 202
    before = len(read_ticks(tmp_path / "ticks.log"))

    # Then a new service takes the start, is told to stop, and the observer ends Deleted
    system.start_service("svc-b", workers=3)
    system.wait_status(created["id"], "Deleted")
    time.sleep(0.5)
    after = read_ticks(tmp_path / "ticks.log")
    # It ran at most briefly on the new service (a few ticks of 0.1 s)
    assert len(after) - before <= 20
    assert system.queue_counts(topology.start_queue_name("default"))[0] == 0
