"""Overload is not death (issue 17): a late service is asked about, not declared lost; the
death step survives a deadlock and never waits for the rows the state consumer changes;
a broker driven far past what it sustains ends no session, loses no service and fences or
fails no observer."""

from __future__ import annotations

import asyncio
import re
import threading
import time
import uuid
import zlib
from datetime import datetime
from pathlib import Path

import aio_pika
import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from shared import topology
from tests.system.test_manager_repairs import sql
from tests.system.test_reliability import event_names
from tests.system.test_write_races import wait_blocked_on_a_lock
from tools import infra
from tools.harness import System, free_port, metric, wait_for


def test_late_heartbeats_of_a_connected_service_are_not_a_death(system: System) -> None:
    # Given a service whose heartbeats come twenty times later than the manager expects
    # (and no inventories, which count as a sign of life too)
    manager = system.start_manager()
    svc = system.start_service("svc-a", workers=5, ORCH_HEARTBEAT_S="20", ORCH_INVENTORY_S="3600")
    ids = [system.create(f"late-{i}", args={"interval_s": 0.5, "emit": False})["id"] for i in range(3)]
    for oid in ids:
        system.wait_status(oid, "Processing")

    # When its heartbeats are late: the broker is asked, and says its connection lives
    wait_for(lambda: "the broker says its connection lives" in manager.text(), 30, "the manager to ask the broker")

    # Then it is still alive, runs its observers and nobody counted a service's death
    assert system.service_by_name("svc-a") is not None
    for oid in ids:
        assert system.observer(oid)["status"] == "Processing"
        assert "host_lost" not in event_names(system, oid)
    assert metric(system, "orch_services_lost_total") == 0
    assert metric(system, "orch_services_late_total") >= 1

    # But once it is really gone (its connection with it), it is lost at once
    svc.kill9()
    wait_for(lambda: system.service_by_name("svc-a", status="lost"), 30, "svc-a lost")
    for oid in ids:
        assert "host_lost" in event_names(system, oid)
    assert metric(system, "orch_services_lost_total") == 1


def test_a_memory_alarm_delays_reports_and_refuses_creates_but_ends_no_session(
    system: System, rabbit: infra.RabbitNode
) -> None:
    # Given a service running tickers that emit five times a second
    system.start_manager()
    svc = system.start_service("svc-a", workers=50)
    ids = [system.create(f"alarm-{i}", args={"interval_s": 0.2})["id"] for i in range(20)]
    for oid in ids:
        system.wait_status(oid, "Processing")

    # When a memory alarm blocks every publishing connection for 6 times the AMQP heartbeat
    rabbit.ctl("set_vm_memory_high_watermark", "0")
    try:
        wait_for(lambda: "blocked" in rabbit.ctl("-q", "list_connections", "state"), 30, "a connection blocked")
        refused = [system.post("/api/observers", {"name": f"during-{i}", "kind": "ticker"}) for i in range(2)]
        time.sleep(6 * 2)
    finally:
        rabbit.ctl("set_vm_memory_high_watermark", "0.4")

    # Then creates were refused with a clear answer and nothing was created...
    for response in refused:
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"]
    assert refused[1].json()["detail"].startswith("the message broker is unreachable or overloaded")
    assert not system.observers(name="during-0") and not system.observers(name="during-1")
    orphans = (
        "SELECT count(*) FROM observer_events e WHERE NOT EXISTS (SELECT FROM observers o WHERE o.id = e.observer_id)"
    )
    assert sql(system.database_url, orphans) == 0  # their history went with their rows
    # ...but the service kept its session and its observers, and nobody was judged lost
    assert "broker session lost" not in svc.text(), svc.text()[-3000:]
    assert "fenced" not in svc.text()
    assert system.service_by_name("svc-a") is not None
    assert metric(system, "orch_services_lost_total") == 0
    for oid in ids:
        assert system.observer(oid)["status"] == "Processing"
    system.wait_status(system.create("after-alarm")["id"], "Processing")


async def test_the_write_api_refuses_past_its_in_flight_bound(system: System) -> None:
    # Given a manager that creates or stops at most 1,000 observers at once
    system.start_manager(ORCH_API_IN_FLIGHT="1000")
    system.start_service("svc-a", workers=3_000)

    def bulk(prefix: str, count: int) -> httpx.Response:
        batch = [{"name": f"{prefix}-{i}", "kind": "ticker", "args": {"emit": False}} for i in range(count)]
        return system.post("/api/observers/bulk", {"observers": batch})

    engine = create_async_engine(system.database_url)
    try:
        async with engine.connect() as other:
            # When a create of 800 is held up in the database (the pool's create lock is taken)
            await other.execute(text("SELECT pg_advisory_lock(:k)"), {"k": zlib.crc32(b"default")})
            held = asyncio.create_task(asyncio.to_thread(bulk, "held", 800))
            await wait_blocked_on_a_lock(engine, "pg_advisory_xact_lock")
            # Then a create or a stop that would go past the bound is refused at once
            refused = await asyncio.to_thread(bulk, "refused", 300)
            stop = await asyncio.to_thread(
                system.post, "/api/observers/bulk-stop", {"ids": [str(uuid.uuid4()) for _ in range(300)]}
            )
            # (one that fits is admitted, and waits its turn)
            fits = asyncio.create_task(asyncio.to_thread(bulk, "small", 100))
            await asyncio.sleep(0.5)
            await other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": zlib.crc32(b"default")})
            await other.commit()
        first, small = await held, await fits
    finally:
        await engine.dispose()
    for response in (refused, stop):
        assert response.status_code == 503, response.text
        assert response.headers["Retry-After"]
        assert "ORCH_API_IN_FLIGHT=1000" in response.json()["detail"]
    assert first.status_code == 201 and small.status_code == 201, (first.text, small.text)
    assert not system.observers(name="refused-0")
    assert metric(system, "orch_api_refused_busy_total") == 2
    # and once the first is through, the refused one goes in
    assert bulk("refused", 300).status_code == 201


def capacity(system: System) -> dict[str, int]:
    body: dict[str, int] = system.get("/api/stats").json()["capacity"]["default"]
    return body


def test_capacity_of_a_late_service_and_of_one_that_returns(system: System, rabbit: infra.RabbitNode) -> None:
    # Given a service of 10 workers whose heartbeats are late, running 5 observers
    manager = system.start_manager()
    svc = system.start_service("svc-a", workers=10, ORCH_HEARTBEAT_S="20", ORCH_INVENTORY_S="3600")
    ids = [system.create(f"cap-{i}", args={"emit": False})["id"] for i in range(5)]
    for oid in ids:
        system.wait_status(oid, "Processing")
    wait_for(lambda: "the broker says its connection lives" in manager.text(), 30, "the manager to ask the broker")

    # Then its workers still count: 5 more fit, exactly, and the 11th is refused
    assert capacity(system) == {"total": 10, "used": 5, "free": 5}
    ids += [system.create(f"cap-{i}", args={"emit": False})["id"] for i in range(5, 10)]
    full = system.post("/api/observers", {"name": "cap-10", "kind": "ticker"})
    assert full.status_code == 503 and "is full: 10/10" in full.json()["detail"], full.text

    # When its connections are cut (it fences, reconnects and gets its observers back; it
    # may be judged lost meanwhile) and it speaks again
    listing = rabbit.ctl("-q", "list_connections", "--no-table-headers", "pid", "client_properties")
    pids = [line.split("\t")[0] for line in listing.splitlines() if "observer-service svc-a" in line]
    assert len(pids) == 2, listing
    for pid in pids:
        rabbit.ctl("close_connection", pid, "test: cut svc-a off")
    wait_for(lambda: "fenced 10 observer(s)" in svc.text(), 30, "svc-a fenced")
    wait_for(
        lambda: all(event_names(system, oid).count("started") == 2 for oid in ids), 60, "all started again on svc-a"
    )
    wait_for(lambda: system.service_by_name("svc-a") is not None, 60, "svc-a alive again")

    # Then every observer and worker is counted once
    assert capacity(system) == {"total": 10, "used": 10, "free": 0}
    assert system.post("/api/observers", {"name": "cap-10", "kind": "ticker"}).status_code == 503
    assert system.delete(f"/api/observers/{ids[0]}").status_code == 202
    system.wait_status(ids[0], "Deleted")
    system.wait_status(system.create("cap-10", args={"emit": False})["id"], "Processing")


async def _deadlock_the_death_step(system: System, ids: list[str], service_id: str, kill: object) -> None:
    engine = create_async_engine(system.database_url)
    try:
        async with engine.connect() as other:
            # A writer that locks in the other order than the step: first the service's row
            # (which the step marks lost last), then the observers' rows (which the step locks
            # FOR NO KEY UPDATE to put them on probation) FOR UPDATE, as a DELETE does. Writing
            # history locks no observer row (no foreign key), so only a step that changes
            # observer rows can deadlock. A long deadlock_timeout makes the step the one aborted.
            await other.execute(text("SET deadlock_timeout = '60s'"))
            await other.execute(text("SELECT id FROM services WHERE id = :id FOR UPDATE"), {"id": service_id})
            assert callable(kill)
            kill()
            await wait_blocked_on_a_lock(engine, "UPDATE services")
            await other.execute(
                text("SELECT id FROM observers WHERE id = ANY(CAST(:ids AS uuid[])) ORDER BY id FOR UPDATE"),
                {"ids": ids},
            )
            await other.commit()
    finally:
        await engine.dispose()


def test_the_death_step_survives_a_deadlock(system: System) -> None:
    # Given 20 observers Processing on svc-a (no inventories: they would lock rows too), and
    # a manager that puts an observer on probation at its first service's death (the step then
    # locks its victims' rows before it marks the service lost)
    manager = system.start_manager(ORCH_PROBATION_AFTER_HOST_DEATHS="1")
    svc = system.start_service("svc-a", workers=20, ORCH_INVENTORY_S="3600")
    ids = sorted(system.create(f"dl-{i}", args={"interval_s": 0.5, "emit": False})["id"] for i in range(20))
    for oid in ids:
        system.wait_status(oid, "Processing")
    service = system.service_by_name("svc-a")
    assert service is not None

    # When svc-a dies and recording its death deadlocks with another writer of those rows
    asyncio.run(_deadlock_the_death_step(system, ids, service["id"], svc.kill9))

    # Then the step lost the race, ran again, and recorded the death of every observer's service
    wait_for(lambda: system.service_by_name("svc-a", status="lost"), 30, "svc-a lost")
    wait_for(lambda: all("host_lost" in event_names(system, oid) for oid in ids), 30, "every host_lost recorded")
    assert "lost a race" in manager.text()


async def _hold_rows_while(system: System, ids: list[str], done: object) -> None:
    """Lock ``ids`` as the state consumer does (FOR NO KEY UPDATE) until ``done()``."""
    engine = create_async_engine(system.database_url)
    try:
        async with engine.connect() as consumer:
            await consumer.execute(
                text("SELECT id FROM observers WHERE id = ANY(CAST(:ids AS uuid[])) ORDER BY id FOR NO KEY UPDATE"),
                {"ids": ids},
            )
            assert callable(done)
            await asyncio.to_thread(done)
            await consumer.rollback()
    finally:
        await engine.dispose()


def test_the_death_step_does_not_wait_for_the_rows_the_consumer_changes(system: System) -> None:
    # Given 20 observers Processing on svc-a, whose rows a transaction of the state consumer
    # holds locked (at 1,000,000 observers a survivor's batch of starts holds thousands)
    system.start_manager()
    svc = system.start_service("svc-a", workers=20, ORCH_INVENTORY_S="3600")
    ids = sorted(system.create(f"held-{i}", args={"interval_s": 0.5, "emit": False})["id"] for i in range(20))
    for oid in ids:
        system.wait_status(oid, "Processing")

    def death_recorded() -> None:
        svc.kill9()
        wait_for(lambda: system.service_by_name("svc-a", status="lost"), 30, "svc-a lost")
        wait_for(lambda: all("host_lost" in event_names(system, oid) for oid in ids), 30, "every host_lost recorded")

    # When svc-a dies, then the step records its death while those rows stay locked: it no
    # longer locks a dead service's observers, so the starts of the services taking them over never
    # wait behind it
    asyncio.run(_hold_rows_while(system, ids, death_recorded))


def test_the_broker_rebuild_does_not_wait_for_rows_another_writer_holds(
    system: System, rabbit: infra.RabbitNode, vhost: str
) -> None:
    # Given 20 observers Processing on svc-a, the rows of the five lowest ids held locked by
    # another transaction (as a batch of the state consumer holds the rows of its reports)
    manager = system.start_manager()
    system.start_service("svc-a", workers=20, ORCH_INVENTORY_S="3600")
    ids = sorted(system.create(f"rb-{i}", args={"interval_s": 0.5, "emit": False})["id"] for i in range(20))
    for oid in ids:
        system.wait_status(oid, "Processing")
    held, free = ids[:5], ids[5:]

    def rebuilt_around_them() -> None:
        # When the broker loses its data
        rabbit.delete_vhost(vhost)
        rabbit.add_vhost(vhost)
        # Then the rebuild releases every row nobody holds while those stay locked: it no
        # longer waits for a held row while holding others, which deadlocked it with the
        # consumer (whose batch holds rows of many reports, not in one id order)
        wait_for(lambda: all("released" in event_names(system, oid) for oid in free), 60, "the free rows released")

    asyncio.run(_hold_rows_while(system, held, rebuilt_around_them))
    # And once that writer let go, every observer runs again
    wait_for(lambda: all(system.observer(oid)["status"] == "Processing" for oid in ids), 60, "all Processing again")
    assert "start(s) again from the database" in manager.text()
    assert "deadlock" not in manager.text()


def test_a_death_is_recorded_once_its_share_has_moved(system: System) -> None:
    # Given svc-a running 30 observers and svc-b full with 30 blockers, and a manager that
    # asks about a service after 8 silent seconds (it judges every 2 s)
    manager = system.start_manager(ORCH_LOST_AFTER_HEARTBEATS="8")
    svc_a = system.start_service("svc-a", workers=30, ORCH_INVENTORY_S="3600")
    moving = [system.create(f"moving-{i}", args={"interval_s": 0.5, "emit": False})["id"] for i in range(30)]
    for oid in moving:
        system.wait_status(oid, "Processing")
    system.start_service("svc-b", workers=30, ORCH_INVENTORY_S="3600")
    blockers = [system.create(f"blocker-{i}", args={"interval_s": 0.5, "emit": False})["id"] for i in range(30)]
    for oid in blockers:
        assert system.wait_status(oid, "Processing")["service_name"] == "svc-b"

    # When svc-a dies and its share can only move as the blockers stop, one every 0.4 s: a
    # takeover that outlasts the silence, as a third of a million observers' does at 1,000,000
    svc_a.kill9()
    for oid in blockers:
        time.sleep(0.4)
        assert system.delete(f"/api/observers/{oid}").status_code == 202

    def all_on_b() -> bool:
        observers = [system.observer(oid) for oid in moving]
        return all(o["status"] == "Processing" and o["service_name"] == "svc-b" for o in observers)

    wait_for(all_on_b, 60, "svc-a's share Processing on svc-b")
    wait_for(lambda: system.service_by_name("svc-a", status="lost"), 60, "svc-a lost")

    # Then its death was recorded after the last of its observers had moved, not beside the
    # takeover, and the manager said why it waited
    history = [e for oid in moving for e in system.get(f"/api/observers/{oid}/events").json()]
    last_move = max(datetime.fromisoformat(e["at"]) for e in history if e["event"] == "moved")
    deaths = [datetime.fromisoformat(e["at"]) for e in history if e["event"] == "host_lost"]
    assert len(deaths) == len(moving)
    assert min(deaths) > last_move
    assert "still taking its observers over" in manager.text()


class EventFlood:
    """Publishes persistent events to ``observers.events`` from threads of its own, as fast
    as the broker takes them, into a bound queue that keeps the newest 200,000."""

    SINK = "test.overload.sink"

    def __init__(self, amqp_url: str, publishers: int = 3) -> None:
        self.amqp_url = amqp_url
        self.stop = threading.Event()
        self.sent = 0
        self.threads = [threading.Thread(target=asyncio.run, args=(self._publish(),)) for _ in range(publishers)]

    def __enter__(self) -> EventFlood:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    async def _publish(self) -> None:
        connection = await aio_pika.connect(self.amqp_url)
        async with connection:
            channel = await connection.channel(publisher_confirms=False)
            queue = await channel.declare_queue(
                self.SINK, durable=True, arguments={"x-max-length": 200_000, "x-overflow": "drop-head"}
            )
            await queue.bind(topology.EVENTS_EXCHANGE, routing_key="#")
            exchange = await channel.get_exchange(topology.EVENTS_EXCHANGE)
            body = b'{"flood": "' + b"x" * 512 + b'"}'
            while not self.stop.is_set():
                for _ in range(200):
                    await exchange.publish(
                        aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "flood.x"
                    )
                self.sent += 200
                await asyncio.sleep(0)


def test_an_overloaded_broker_kills_nobody(system: System) -> None:
    # Given two services running 1,200 tickers that emit ten times a second
    manager = system.start_manager()
    services = [system.start_service(f"svc-{n}", workers=1_000) for n in "ab"]
    names = [f"busy-{i}" for i in range(1_200)]
    for start in range(0, len(names), 400):
        batch = [{"name": n, "kind": "ticker", "args": {"interval_s": 0.1}} for n in names[start : start + 400]]
        response = system.post("/api/observers/bulk", {"observers": batch})
        assert response.status_code == 201, response.text
    wait_for(lambda: system.get("/api/stats").json()["observers"].get("Processing") == len(names), 120, "all running")

    # When the broker is flooded with persistent events from three more publishers for 40 s,
    # far past what it routes (the tickers alone ask for 12,000 events/s)
    with EventFlood(system.amqp_url) as flood:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            # creates and stops keep coming meanwhile: answered, or refused with a 503
            response = system.post(
                "/api/observers/bulk",
                {"observers": [{"name": f"late-{time.monotonic_ns()}", "kind": "ticker", "args": {"emit": False}}]},
            )
            assert response.status_code in (201, 503), response.text
            time.sleep(1)
    assert flood.sent > 0

    # Then nobody died: no session ended, no service lost, nothing fenced or failed
    time.sleep(5)  # judging runs on: give a late verdict the chance to show
    for svc in services:
        assert svc.alive()
        assert "broker session lost" not in svc.text(), svc.text()[-3000:]
        assert "fenced" not in svc.text()
    assert metric(system, "orch_services_lost_total") == 0, manager.text()[-3000:]
    stats = system.get("/api/stats").json()
    assert stats["services"]["alive"] == 2 and stats["services"]["lost"] == 0
    assert stats["observers"].get("Failed", 0) == 0
    assert stats["probation"] == 0
    wait_for(
        lambda: {status for status, n in system.get("/api/stats").json()["observers"].items() if n} == {"Processing"},
        120,
        "all Processing in the end",
    )


def test_a_service_whose_loop_is_starved_keeps_its_session(system: System, tmp_path: Path) -> None:
    # Given a service running tickers
    manager = system.start_manager()
    svc = system.start_service("svc-a", workers=50, ORCH_PERIODIC_MODULES="tests.periodic_funcs")
    ids = [system.create(f"tick-{i}", args={"interval_s": 0.5})["id"] for i in range(10)]
    for oid in ids:
        system.wait_status(oid, "Processing")

    # When its observers' loop gets no turn for six AMQP heartbeat intervals (12 s): one
    # observer keeps it busy without yielding, as an overloaded service's loop is
    marks = tmp_path / "hog"
    args = {"function": "tests.periodic_funcs:hog_loop", "kwargs": {"seconds": 12, "path": str(marks)}}
    hog = system.create("hog", kind="periodic", args=args | {"interval_s": 3600})["id"]
    wait_for(lambda: marks.exists() and "end" in marks.read_text(), 90, "the loop to be starved and to recover")

    # Then the holding connection (its own thread) kept the session: nothing fenced, no
    # service lost, and every observer still runs where it ran
    time.sleep(3)
    assert svc.alive()
    assert "broker session lost" not in svc.text(), svc.text()[-3000:]
    assert "fenced" not in svc.text()
    assert metric(system, "orch_services_lost_total") == 0, manager.text()[-3000:]
    stats = system.get("/api/stats").json()
    assert stats["observers"].get("Failed", 0) == 0 and stats["probation"] == 0
    alive = system.service_by_name("svc-a")
    assert alive is not None
    service_id = alive["id"]
    for oid in [*ids, hog]:
        observer = system.observer(oid)
        assert (observer["status"], observer["service_id"]) == ("Processing", service_id), observer
        assert "host_lost" not in event_names(system, oid)


def test_a_burst_of_starts_past_the_outbox_waits_for_its_reports_and_drops_none(
    system: System, rabbit: infra.RabbitNode
) -> None:
    # Given 600 idle observers on svc-a, and svc-b whose outbox holds 100 reports (a
    # stand-in for a burst of 400,000 against the default 200,000) and starts no more once
    # 20 wait; no inventory would repair a lost report
    system.start_manager()
    svc_a = system.start_service("svc-a", workers=1000)
    batch = [{"name": f"burst-{i}", "kind": "idle"} for i in range(600)]
    response = system.post("/api/observers/bulk", {"observers": batch})
    assert response.status_code == 201, response.text
    wait_for(lambda: len(system.observers(status="Processing")) == 600, 60, "600 Processing")
    port = free_port()
    svc_b = system.start_service(
        "svc-b",
        workers=1000,
        ORCH_OUTBOX_MAX="100",
        ORCH_OUTBOX_HIGH_WATER="20",
        ORCH_INVENTORY_S="3600",
        ORCH_METRICS_PORT=str(port),
    )

    # When svc-a dies while a memory alarm keeps svc-b from publishing its reports: the
    # broker hands it all 600 at once, and they cannot be reported yet
    rabbit.ctl("set_vm_memory_high_watermark", "0")
    try:
        wait_for(lambda: "blocked" in rabbit.ctl("-q", "list_connections", "state"), 30, "a connection blocked")
        svc_a.kill9()
        time.sleep(5)
        service_metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        held_back = re.search(r"^orch_service_starts_held_back_total (\S+)$", service_metrics, re.MULTILINE)
    finally:
        rabbit.ctl("set_vm_memory_high_watermark", "0.4")

    # Then svc-b started only what its outbox could hold and waited with the rest (held,
    # unstarted), dropped no report, and once publishing resumed all 600 run there
    assert held_back is not None and float(held_back.group(1)) >= 1, svc_b.text()[-3000:]
    b = wait_for(lambda: system.service_by_name("svc-b"), 30, "svc-b alive")
    assert b is not None
    wait_for(
        lambda: sum(o["service_id"] == b["id"] for o in system.observers(status="Processing")) == 600,
        90,
        "all 600 Processing on svc-b",
    )
    assert "dropped" not in svc_b.text(), svc_b.text()[-3000:]
    assert "fenced" not in svc_b.text()
