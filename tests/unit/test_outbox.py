"""``observer_service.outbox``: state reports kept in order, packed into batches, bounded by a
high water, dropped with a dead session."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import pytest

from observer_service.outbox import Outbox, StartedReport, pack
from shared.errors import DecodeError
from shared.messages import (
    ObserversStarted,
    ObserverStopped,
    ReportBatch,
    ServiceHeartbeat,
    ServiceInventory,
    decode_state,
)


def test_outbox_keeps_order_and_drops_only_confirmed_heads() -> None:
    async def scenario() -> None:
        outbox = Outbox(max_size=3)
        ids = [uuid.uuid4() for _ in range(4)]
        for sid in ids:
            outbox.put(ServiceHeartbeat(service_id=sid, running=0))
        batch = await outbox.peek_batch(2)
        assert [m.service_id for m in batch] == ids[1:3]  # type: ignore[union-attr]  # the oldest was dropped
        outbox.drop_head(2)
        assert len(outbox) == 1
        assert not await outbox.wait_empty(0.01)
        outbox.drop_head(1)
        assert await outbox.wait_empty(0.01)

    asyncio.run(scenario())


def test_pack_batches_consecutive_observer_reports_in_order() -> None:
    sid = uuid.uuid4()
    stopped = [ObserverStopped(observer_id=uuid.uuid4(), service_id=sid) for _ in range(5)]
    heartbeat = ServiceHeartbeat(service_id=sid, running=5)
    packed = pack([*stopped[:3], heartbeat, *stopped[3:4], *stopped[4:]], per_batch=2)
    assert [type(m).__name__ for m in packed] == ["ReportBatch", "ObserverStopped", "ServiceHeartbeat", "ReportBatch"]
    flattened = [r for m in packed if isinstance(m, ReportBatch) for r in m.reports]
    assert flattened == [stopped[0], stopped[1], stopped[3], stopped[4]]
    assert decode_state(packed[0].encode()) == packed[0]


def test_pack_sends_runs_of_starts_with_the_same_session_as_one_message_in_order() -> None:
    sid, session, other_session = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    def started(session_id: uuid.UUID, redelivered: bool = True) -> StartedReport:
        return StartedReport(uuid.uuid4(), sid, session_id, redelivered, "async")

    run = [started(session) for _ in range(5)]
    stop = ObserverStopped(observer_id=uuid.uuid4(), service_id=sid)
    fresh, elsewhere = started(session, redelivered=False), started(other_session)
    packed = pack([*run, stop, run[0], fresh, elsewhere], per_batch=3)

    assert [type(m).__name__ for m in packed] == [
        "ObserversStarted",  # run[0:3]: at most per_batch ids
        "ObserversStarted",  # run[3:5]
        "ObserverStopped",  # keeps its place between the starts
        "ObserversStarted",  # run[0] again (started again after the stop)
        "ObserversStarted",  # not redelivered: a message of its own
        "ObserversStarted",  # another session
    ]
    messages = [decode_state(m.encode()) for m in packed]  # what the manager reads
    ids = [list(m.observer_ids) for m in messages if isinstance(m, ObserversStarted)]
    assert ids == [
        [r.observer_id for r in run[:3]],
        [r.observer_id for r in run[3:]],
        [run[0].observer_id],
        [fresh.observer_id],
        [elsewhere.observer_id],
    ]
    first, not_redelivered, last = messages[0], messages[4], messages[5]
    assert isinstance(first, ObserversStarted) and isinstance(not_redelivered, ObserversStarted)
    assert isinstance(last, ObserversStarted)
    assert (first.service_id, first.session_id, first.redelivered) == (sid, session, True)
    assert not not_redelivered.redelivered and last.session_id == other_session


def test_a_start_report_naming_no_observer_is_malformed() -> None:
    report = ObserversStarted(service_id=uuid.uuid4(), observer_ids=[uuid.uuid4()]).model_dump(mode="json")
    with pytest.raises(DecodeError):
        decode_state(json.dumps({**report, "observer_ids": []}).encode())


async def test_the_outbox_has_room_for_starts_until_its_high_water() -> None:
    outbox = Outbox(max_size=100, high_water=3)
    service = uuid.uuid4()
    for _ in range(3):
        assert outbox.has_room()
        outbox.put(StartedReport(uuid.uuid4(), service, uuid.uuid4(), False, "async"))
    assert not outbox.has_room()
    waiting = asyncio.create_task(outbox.room())
    await asyncio.sleep(0.01)
    assert not waiting.done()  # a start waits while three reports are unpublished...
    outbox.drop_head(1)  # ...until the broker confirmed one
    await asyncio.wait_for(waiting, 1)
    dead = object()
    outbox.put(StartedReport(uuid.uuid4(), service, uuid.uuid4(), False, "async"), dead)
    waiting = asyncio.create_task(outbox.room())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    outbox.discard_started(dead)  # or its session died and took its report with it
    await asyncio.wait_for(waiting, 1)


def test_a_full_outbox_says_what_it_dropped_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    outbox = Outbox(max_size=10)
    service = uuid.uuid4()
    with caplog.at_level(logging.WARNING, logger="observer_service.outbox"):
        for _ in range(1000):
            outbox.put(ServiceHeartbeat(service_id=service, running=1))
    assert len(outbox) == 10
    lines = [r.message for r in caplog.records]
    assert lines == ["state outbox full (10): dropped 1 ServiceHeartbeat"], lines  # not 990 lines


async def test_unpublished_starts_and_inventories_of_a_dead_session_are_dropped() -> None:
    outbox, dead, live = Outbox(), object(), object()
    service, observer = uuid.uuid4(), uuid.uuid4()
    outbox.put(StartedReport(observer, service, uuid.uuid4(), True, "async"), dead)
    outbox.put(StartedReport(observer, service, uuid.uuid4(), True, "async"), dead)  # a second start
    outbox.put(ServiceInventory(service_id=service, observer_ids=[observer]), dead)
    outbox.put(ObserverStopped(observer_id=observer, service_id=service), dead)  # an ack was sent: keep
    outbox.put(StartedReport(observer, service, uuid.uuid4(), False, "async"), live)
    outbox.put(ServiceHeartbeat(service_id=service, running=1))
    assert outbox.discard_started(dead) == 3
    kept = await outbox.peek_batch(10)
    assert [type(m).__name__ for m in kept] == ["ObserverStopped", "StartedReport", "ServiceHeartbeat"]
