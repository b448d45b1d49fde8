"""Pure logic, in-process: contracts, lease, outbox, settings, cursors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import aiormq
import pytest
from aiormq.exceptions import ChannelInvalidStateError
from pydantic import ValidationError

from bench import broker_work
from bench.broker_work import busy_seconds
from bench.scale import SCALE_ENV
from bench.scenarios import BENCH_ENV
from manager.api.schemas import _retry_policy
from manager.background import BackgroundLoops, StepSchedule
from manager.broker import reconnect_interval
from manager.db.engine import decode_json
from manager.db.errors import OutageLog
from manager.errors import Invalid
from manager.queries import decode_cursor, encode_cursor
from manager.state.consumer import StateConsumer
from manager.state.outgoing import Outgoing
from observer_service.lease import Lease
from observer_service.loop_thread import Mailbox
from observer_service.outbox import Outbox, StartedReport, pack
from observer_service.session import prefetch_chunks
from shared.amqp_errors import describe_close, describe_connect_failure
from shared.errors import DecodeError, LeaseLost
from shared.logs import configure_logging, last_chatter
from shared.messages import (
    STOPS_PER_MESSAGE,
    IntroduceRequest,
    InventoryRequest,
    IsolateObservers,
    ObserversStarted,
    ObserverStarted,
    ObserverStopped,
    ReportBatch,
    RetryPolicy,
    ServiceHeartbeat,
    StartObserver,
    StopObserver,
    StopObservers,
    decode_control,
    decode_start,
    decode_state,
)
from shared.settings import ManagerSettings, ServiceSettings, amqp_url_with_heartbeat
from tools.harness import FAST_ENV


def test_messages_round_trip_by_type() -> None:
    started = ObserverStarted(observer_id=uuid.uuid4(), service_id=uuid.uuid4(), redelivered=True)
    assert decode_state(started.encode()) == started
    stop = StopObserver(observer_id=uuid.uuid4())
    assert decode_control(stop.encode()) == stop
    start = StartObserver(observer_id=uuid.uuid4(), name="n", kind="ticker", args={"interval_s": 2})
    assert decode_start(start.encode()) == start


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[]",
        b'{"type": "Nope"}',
        b'{"type": "ServiceHeartbeat"}',
        b'{"type": "ObserverStarted", "x": 1}',
    ],
)
def test_garbage_state_bodies_raise_decode_error(body: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_state(body)


def test_a_message_of_another_stream_is_refused() -> None:
    heartbeat = ServiceHeartbeat(service_id=uuid.uuid4(), running=1)
    with pytest.raises(DecodeError):
        decode_control(heartbeat.encode())
    with pytest.raises(DecodeError):
        decode_start(heartbeat.encode())


def test_lease_is_valid_for_half_the_heartbeat_after_a_round_trip_was_sent() -> None:
    lease = Lease(heartbeat_s=2)
    with pytest.raises(LeaseLost, match="not connected"):
        lease.ensure()
    lease.renew(time.monotonic())
    lease.ensure()
    assert 0.9 < lease.remaining_s() <= 1.0
    lease.renew(time.monotonic() - 5)  # an older round trip never shortens the lease
    lease.ensure()
    lease.revoke()
    assert not lease.is_valid()


def test_lease_lapses_when_the_last_round_trip_is_too_old() -> None:
    lease = Lease(heartbeat_s=2)
    lease.renew(time.monotonic() - 1.5)
    with pytest.raises(LeaseLost, match="lapsed"):
        lease.ensure()


def test_a_round_trip_sent_before_a_revocation_does_not_renew_the_lease() -> None:
    # The old session's round trip, answered after the session was given up, proves nothing.
    lease = Lease(heartbeat_s=2)
    sent_at = time.monotonic()
    lease.revoke()
    lease.renew(sent_at)
    assert not lease.is_valid()
    lease.renew(time.monotonic())
    assert lease.is_valid()


async def test_a_renewal_on_another_thread_wakes_the_observers_waiting_on_this_loop() -> None:
    # The holding thread renews; the observers wait on the main loop (hold.py).
    lease = Lease(heartbeat_s=2)
    lease.renew(time.monotonic() - 5)
    waiters = [asyncio.create_task(lease.changed()) for _ in range(3)]
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiters)
    renewer = threading.Thread(target=lambda: lease.renew(time.monotonic()))
    renewer.start()
    renewer.join()
    await asyncio.wait_for(asyncio.gather(*waiters), 5)
    assert lease.is_valid()


async def test_a_mailbox_runs_calls_from_other_threads_in_order_on_its_loop() -> None:
    mailbox = Mailbox(asyncio.get_running_loop())
    ran: list[tuple[int, int, bool]] = []
    main = threading.get_ident()

    def record(sender: int, n: int) -> None:
        ran.append((sender, n, threading.get_ident() == main))

    def send(sender: int) -> None:
        for n in range(5_000):
            mailbox.post(record, sender, n)

    senders = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for sender in senders:
        sender.start()
    for sender in senders:
        await asyncio.to_thread(sender.join)
    await asyncio.sleep(0.1)
    assert len(ran) == 15_000 and all(on_main for _, _, on_main in ran)
    for i in range(3):
        assert [n for s, n, _ in ran if s == i] == list(range(5_000))


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


def test_settings_parse_pools_and_reject_bad_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_POOLS", "default, gpu ,io")
    assert ServiceSettings().pools == ["default", "gpu", "io"]
    monkeypatch.setenv("ORCH_POOLS", "bad pool!")
    with pytest.raises(ValidationError, match="pools"):
        ServiceSettings()


def test_amqp_heartbeat_is_added_unless_given() -> None:
    assert amqp_url_with_heartbeat("amqp://h/", 6) == "amqp://h/?heartbeat=6"
    assert amqp_url_with_heartbeat("amqp://h/?x=1", 6) == "amqp://h/?x=1&heartbeat=6"
    assert amqp_url_with_heartbeat("amqp://h/?heartbeat=9", 6) == "amqp://h/?heartbeat=9"


def test_cursor_round_trip_and_garbage() -> None:
    now, oid = datetime.now(UTC), uuid.uuid4()
    assert decode_cursor(encode_cursor(now, oid)) == (now, oid)
    with pytest.raises(Invalid, match="cursor"):
        decode_cursor("garbage!")


def test_prefetch_is_split_into_16_bit_consumers() -> None:
    assert prefetch_chunks(1) == [1]
    assert prefetch_chunks(65_535) == [65_535]
    assert prefetch_chunks(100_000) == [65_535, 34_465]
    assert sum(prefetch_chunks(200_000)) == 200_000
    assert prefetch_chunks(10_000, 4_096) == [4_096, 4_096, 1_808]
    assert prefetch_chunks(100_000, 100_000) == [65_535, 34_465]


def test_pack_batches_consecutive_observer_reports_in_order() -> None:
    sid = uuid.uuid4()
    started = [ObserverStarted(observer_id=uuid.uuid4(), service_id=sid) for _ in range(5)]
    heartbeat = ServiceHeartbeat(service_id=sid, running=5)
    packed = pack([*started[:3], heartbeat, *started[3:4], *started[4:]], per_batch=2)
    assert [type(m).__name__ for m in packed] == ["ReportBatch", "ObserverStarted", "ServiceHeartbeat", "ReportBatch"]
    flattened = [r for m in packed if isinstance(m, ReportBatch) for r in m.reports]
    assert flattened == [started[0], started[1], started[3], started[4]]
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


def test_background_steps_with_long_thresholds_run_at_a_quarter_of_them() -> None:
    # Given the default thresholds: re-stop after 10 s, lost starts after 60 s
    loops = BackgroundLoops.__new__(BackgroundLoops)
    loops.settings = ManagerSettings()
    schedule = StepSchedule(loops._periods())
    assert schedule.periods["restop"] == 2.5 and schedule.periods["republish_lost"] == 15.0
    assert schedule.periods["judge_heartbeats"] == 3.75  # a quarter of 3 heartbeats of 5 s
    assert schedule.periods["fold_counts"] == 5.0  # readers add up what is not folded yet
    assert all(callable(getattr(loops, step, None)) for step in schedule.periods)  # each names a step

    # A step with a period runs, then not again until the period passed
    assert schedule.due("restop", 100.0)
    schedule.ran("restop", 100.0)
    assert not schedule.due("restop", 102.0) and schedule.due("restop", 102.5)
    # A step without one runs every pass; a step that failed (not marked ran) runs next pass
    schedule.ran("describe_unknown", 100.0)
    assert schedule.due("describe_unknown", 100.0)
    assert schedule.due("republish_lost", 100.0)


def test_idle_floor_sums_microstate_accounting_by_activity_without_sleep() -> None:
    printed = """#{{dirty_cpu_scheduler,gc} => 920470,
  {scheduler,sleep} => 119830360,
  {dirty_cpu_scheduler,emulator} => 1164814,
  {scheduler,emulator} => 82895,
  {aux,other} => 17}"""
    assert busy_seconds(printed) == {
        "dirty_cpu_scheduler emulator": 1.16,
        "dirty_cpu_scheduler gc": 0.92,
        "scheduler emulator": 0.08,
    }


def test_broker_work_reads_reductions_collections_thread_states_and_the_traced_heap() -> None:
    printed = """["kind {rabbit_channel,init,1} reductions=3563695 processes=382 max_heap_words=229376",
 "kind {rabbit_prequeue,init,1} reductions=400593 processes=9 max_heap_words=137522381",
 "gc collections=1550 reclaimed_words=17065984",
 "msacc #{{scheduler,sleep} => 7381565,{dirty_cpu_scheduler,gc} => 33357000,{scheduler,emulator} => 45652000}",
 "traced minor=15 major=7 ns=32708000000"]"""
    assert broker_work.parse(printed, "rabbit_prequeue:init/1") == [
        {"process": "rabbit_channel:init/1", "reductions": 3563695, "processes": 382, "max_heap_mib": 1.8},
        {"process": "rabbit_prequeue:init/1", "reductions": 400593, "processes": 9, "max_heap_mib": 1049.2},
        {"process": "garbage collection (all)", "collections": 1550, "reclaimed_mib": 130.2},
        {"process": "thread states (s)", "scheduler emulator": 45.65, "dirty_cpu_scheduler gc": 33.36},
        {"process": "collections of rabbit_prequeue:init/1", "minor": 15, "major": 7, "seconds": 32.708},
    ]


def test_the_cost_curve_runs_the_product_at_its_default_settings() -> None:
    """``make bench-scale`` measures the system as a user runs it: none of the test harness's
    fast clocks nor ``make bench``'s timings may reach it, only warnings-only logging."""
    for name in FAST_ENV.keys() | BENCH_ENV.keys():
        if name == "ORCH_LOG_LEVEL":
            continue
        setting = name.removeprefix("ORCH_").lower()
        models = [model for model in (ServiceSettings, ManagerSettings) if setting in model.model_fields]
        assert models, f"{name} is not a setting"
        default = models[0].model_fields[setting].default
        assert float(SCALE_ENV[name]) == float(default), name
    assert SCALE_ENV["ORCH_HEARTBEAT_S"] == "5.0" and SCALE_ENV["ORCH_SWEEP_INTERVAL_S"] == "1.0"
    assert SCALE_ENV["ORCH_LOG_LEVEL"] == "WARNING"


def test_outgoing_merges_stops_per_target_and_isolations_per_host_and_asks_once() -> None:
    host, other, session_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    moved = [uuid.uuid4() for _ in range(STOPS_PER_MESSAGE + 5)]
    lone, isolated = uuid.uuid4(), [uuid.uuid4(), uuid.uuid4()]
    first, second = Outgoing(), Outgoing()
    for observer_id in moved[:10]:
        first.stop(observer_id, host, "moved to another host", session_id)
    first.isolate(isolated[0], other)
    first.messages.append(InventoryRequest(service_id=host))
    for observer_id in moved[10:]:
        second.stop(observer_id, host, "moved to another host", session_id)
    second.stop(lone, other, "duplicate start message")
    second.stop(lone, other, "duplicate start message")  # decided twice in one batch: sent once
    second.stop(moved[3], host, "moved to another host", session_id)  # and across merged batches
    second.isolate(isolated[1], other)
    second.messages.append(InventoryRequest(service_id=host))
    second.introduce(other)
    first.add(second)

    messages = first.batched()
    batches = [m for m in messages if isinstance(m, StopObservers)]
    assert [len(b.observer_ids) for b in batches] == [STOPS_PER_MESSAGE, 5]
    assert [oid for b in batches for oid in b.observer_ids] == moved  # in the order decided
    assert all((b.service_id, b.session_id, b.reason) == (host, session_id, "moved to another host") for b in batches)
    singles = [m for m in messages if isinstance(m, StopObserver)]
    assert [(m.observer_id, m.service_id, m.session_id) for m in singles] == [(lone, other, None)]
    isolations = [m for m in messages if isinstance(m, IsolateObservers)]
    assert [(m.service_id, m.observer_ids) for m in isolations] == [(other, isolated)]
    assert [type(m) for m in messages if isinstance(m, InventoryRequest | IntroduceRequest)] == [
        InventoryRequest,
        IntroduceRequest,
    ]


async def test_acking_state_messages_whose_channel_closed_meanwhile_does_not_raise() -> None:
    # aio-pika's message.channel raises once its channel is closed; the consumer must carry
    # on (the broker redelivers them, and they are skipped as applied before).
    class ClosedChannelMessage:
        @property
        def channel(self) -> object:
            raise ChannelInvalidStateError

        async def ack(self, multiple: bool = False) -> None:
            raise AssertionError("nothing to ack on a closed channel")

    report = ServiceHeartbeat(service_id=uuid.uuid4(), running=0)
    await StateConsumer._ack([(ClosedChannelMessage(), report)] * 2)  # type: ignore[list-item]


async def test_state_consumer_applies_the_next_batch_while_the_last_ones_follow_ups_are_published() -> None:
    # Publishing a batch's follow-ups waits for the broker's confirms; the next transaction
    # must not wait for them, yet each batch is acked only after its own follow-ups went out,
    # and batches are published and acked in the order they committed.
    log: list[str] = []
    first_published = asyncio.Event()
    release_first = asyncio.Event()

    class Message:
        def __init__(self, name: str) -> None:
            self.name = name
            self.channel = "the channel"

        async def ack(self, multiple: bool = False) -> None:
            log.append(f"ack {self.name}")

    consumer = StateConsumer(None, None, None)  # type: ignore[arg-type]

    async def transaction(reports: list[object]) -> Outgoing:
        name = reports[0].service_id.hex[:4]  # type: ignore[attr-defined]
        log.append(f"apply {name}")
        out = Outgoing()
        out.introduce(reports[0].service_id)  # type: ignore[attr-defined]
        return out

    async def publish(outgoing: Outgoing) -> None:
        name = outgoing.messages[0].service_id.hex[:4]  # type: ignore[attr-defined]
        log.append(f"publish {name}")
        if name == "aaaa":
            first_published.set()
            await release_first.wait()

    consumer._transaction = transaction  # type: ignore[method-assign,assignment]
    consumer._publish = publish  # type: ignore[method-assign]
    run = asyncio.create_task(consumer.run())
    try:
        for name in ("aaaa", "bbbb"):
            report = ServiceHeartbeat(service_id=uuid.UUID(name * 8), running=0)
            consumer._inbox.put_nowait((Message(name), report))  # type: ignore[arg-type]
            if name == "aaaa":
                await asyncio.wait_for(first_published.wait(), 5)
        for _ in range(100):
            if "apply bbbb" in log:
                break
            await asyncio.sleep(0.01)
        assert log == ["apply aaaa", "publish aaaa", "apply bbbb"]  # applied while aaaa's publish waits
        assert not consumer.idle()
        release_first.set()
        for _ in range(100):
            if consumer.idle():
                break
            await asyncio.sleep(0.01)
        assert log == ["apply aaaa", "publish aaaa", "apply bbbb", "ack aaaa", "publish bbbb", "ack bbbb"]
        assert consumer.idle()
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run


@pytest.mark.parametrize(
    "document",
    [
        '{"symbol": "BTC", "interval_s": 60, "emit": true, "note": "é ✓", "big": 12345678901234567890, "x": 1.5}',
        '{"max_attempts": null, "factor": 2.0}',
        "[" * 250 + "]" * 250,  # past pydantic-core's nesting limit (200), within the json module's
        "[" * 900 + "]" * 900,
    ],
)
def test_jsonb_values_decode_as_the_json_module_decodes_them(document: str) -> None:
    assert decode_json(document) == json.loads(document)


def test_list_rows_with_one_stored_retry_policy_share_one_model() -> None:
    stored: dict[str, Any] = {"max_attempts": None, "initial_delay_s": 1.0, "factor": 2.0, "jitter": 0.1}
    first, second = _retry_policy(dict(stored)), _retry_policy(dict(stored))
    other = _retry_policy(stored | {"max_attempts": 3})
    assert first is second
    assert first == RetryPolicy.model_construct(**stored)
    assert other is not first and other is not None and other.max_attempts == 3
    assert _retry_policy(None) is None


def test_a_lost_broker_connection_is_retried_soon_at_first_and_seldom_in_a_long_outage() -> None:
    # A quarter of the time down: a blip is retried within a fraction of a second (the
    # rebuild after a broker lost its data waits for it), an outage of minutes every 5 s.
    assert reconnect_interval(0.0) == 0.2
    assert reconnect_interval(2.0) == 0.5
    assert reconnect_interval(12.0) == 3.0
    assert reconnect_interval(600.0) == 5.0


def test_library_connection_chatter_is_shown_only_at_debug(capsys: pytest.CaptureFixture[str]) -> None:
    # aiormq and aio-pika log a lost connection, and every failed attempt to reopen it, as
    # ERRORs; the product says it once in its own words. Anything else they log stays.
    transport = logging.getLogger("aiormq.connection")
    tools = logging.getLogger("aio_pika.tools")

    def chatter() -> None:
        transport.error("error when creating transport: %r", ConnectionRefusedError(111, "Connection refused"))
        transport.error("Unexpected connection close from remote %r", "CONNECTION_FORCED")
        tools.error(
            "Callback %r error: %s: %s",
            "<OneShotCallback: cb=<bound method RobustChannel._on_close of <RobustChannel>>>",
            "ChannelInvalidStateError",
            "No active transport in channel",
        )
        tools.error(  # the channel closed just before its connection (a vhost deleted)
            "Callback %r error: %s: %s",
            "<OneShotCallback: cb=<bound method RobustChannel._on_close of <RobustChannel>>>",
            "RuntimeError",
            RuntimeError('<Connection: "amqp://orch:******@127.0.0.1:5682/v" at 0x7f> closed'),
        )
        tools.error(  # any other failure to reopen is shown, as a WARNING
            "Callback %r error: %s: %s",
            "<OneShotCallback: cb=<bound method RobustChannel._on_close of <RobustChannel>>>",
            "ChannelAccessRefused",
            "ACCESS_REFUSED - access to exchange 'orch.dead' in vhost 'v' refused for user 'orch'",
        )
        transport.error("Unexpected frame %r", "a frame")  # not chatter
        tools.error("Callback %r error: %s: %s", "<OneShotCallback: cb=ours>", "KeyError", "x")  # ours failed

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("INFO", "unit")
        chatter()
        shown = capsys.readouterr().err
        assert "creating transport" not in shown and "Unexpected connection close" not in shown, shown
        assert shown.count("RobustChannel._on_close") == 1, shown
        assert "WARNING [unit] aio_pika.tools: Callback" in shown and "ACCESS_REFUSED" in shown, shown
        assert "ERROR [unit] aiormq.connection: Unexpected frame 'a frame'" in shown, shown
        assert "ERROR [unit] aio_pika.tools: Callback '<OneShotCallback: cb=ours>' error: KeyError" in shown, shown
        # what was kept from the log can still be quoted (the manager's "still unreachable")
        assert last_chatter("aiormq.connection") == "Unexpected connection close from remote 'CONNECTION_FORCED'"

        configure_logging("DEBUG", "unit")  # configured again: still one filter per logger
        chatter()
        shown = capsys.readouterr().err
        assert shown.count("DEBUG [unit] aiormq.connection: error when creating transport") == 1, shown
        assert shown.count("DEBUG [unit] aio_pika.tools: Callback") == 2, shown
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_a_database_outage_is_told_when_it_begins_each_minute_and_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("unit.outage")
    outage = OutageLog("applying state reports", log, every_s=3600)
    with caplog.at_level(logging.DEBUG, logger="unit.outage"):
        outage.worked()  # nothing failed: nothing to say
        for _ in range(5):  # a retry a second
            outage.failed(ConnectionRefusedError(111, "Connection refused"))
        outage.worked()
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said[0] == (
        "WARNING",
        "applying state reports: the database is unavailable or busy "
        "(ConnectionRefusedError: [Errno 111] Connection refused); retrying",
    )
    assert [level for level, _ in said] == ["WARNING", "DEBUG", "DEBUG", "DEBUG", "DEBUG", "INFO"]
    assert said[-1][1].startswith("applying state reports: the database answers again after 0s and 5 failed")

    caplog.clear()
    reminded = OutageLog("background repairs", log, every_s=0)  # a minute has always passed
    with caplog.at_level(logging.DEBUG, logger="unit.outage"):
        reminded.failed(OSError("down"))
        reminded.failed(OSError("down"))
    assert "still unavailable or busy after 0s and 2 attempts (OSError: down)" in caplog.records[-1].getMessage()


def test_a_refused_virtual_host_is_told_by_name_and_other_connect_failures_as_they_are() -> None:
    refused = aiormq.exceptions.InvalidFrameError(
        "Expected one of ['Connection.OpenOk'], got <Connection.Close object at 0x7f3>"
    )
    said = describe_connect_failure(refused, "amqp://orch:secret@127.0.0.1:5672/%2F")
    assert said.startswith("the broker refused the virtual host '/' to user 'orch'") and "secret" not in said
    assert "'orch-prod'" in describe_connect_failure(refused, "amqp://orch:secret@127.0.0.1:5672/orch-prod")
    other = ConnectionRefusedError(111, "Connection refused")
    assert describe_connect_failure(other, "amqp://orch:secret@127.0.0.1:5672/") == repr(other)


def test_a_connection_that_stopped_answering_is_told_as_such() -> None:
    # aiormq cancels its reader when no frame came for (heartbeat + 1) x 3 seconds
    said = describe_close(asyncio.CancelledError(), 6)
    assert said.startswith("no frame from the broker for 21s") and "stopped answering" in said
    forced = aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED - broker forced connection closure")
    assert describe_close(forced, 6) == f"closed by broker or network: {forced!r}"
