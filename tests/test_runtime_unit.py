"""Pure logic of the observer runtime: retry policy, capacity formula, kind discovery,
validation of new observers against announced kinds."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
import uuid
import weakref
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from pydantic import BaseModel

from manager.errors import Invalid, Unavailable
from manager.kinds import KindCatalog, NewObserver, OfferedKind, validate
from observer_service import gc_policy
from observer_service.capacity import Budgets, auto_capacity, sized
from observer_service.emits import Slots
from observer_service.gc_policy import FREEZE_EVERY, GcPolicy, resident_bytes
from observer_service.held import Held
from observer_service.lease import Lease
from observer_service.observer import Context, Running, _lease_back, supervise
from observer_service.outbox import Outbox, StartedReport
from observer_service.runner import Runner
from observer_service.service import reconnect_delay
from observer_service.watchdog import LoopWatchdog, process_paused
from shared.errors import LeaseLost
from shared.kinds import BUILTIN_KINDS, LoadedKind, discover_kinds, load_ref
from shared.messages import (
    KindInfo,
    ObserverStarted,
    ObserverStopped,
    RetryPolicy,
    ServiceHeartbeat,
    ServiceInventory,
    StartObserver,
    digest_of,
)
from shared.observer_api import ObserverContext, ObserverKind
from shared.settings import ServiceSettings


def test_retry_delays_grow_by_the_factor_up_to_the_cap_with_bounded_jitter() -> None:
    policy = RetryPolicy(initial_delay_s=1, factor=2, max_delay_s=10, jitter=0.1, max_attempts=4)
    assert [policy.delay_s(n, 0) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 8, 10]
    assert policy.delay_s(1, 1) == pytest.approx(1.1) and policy.delay_s(1, -1) == pytest.approx(0.9)
    assert policy.delay_s(10_000, 0) == 10  # no overflow
    assert [policy.gives_up(n) for n in (3, 4)] == [False, True]
    assert not RetryPolicy(max_attempts=None).gives_up(10**9)


def test_a_service_retries_its_broker_session_jittered_and_within_two_seconds() -> None:
    """Every second of backoff past the broker's return is a second the service runs nothing,
    and a fleet cut at one instant must not retry in lockstep."""
    first = [reconnect_delay(1) for _ in range(50)]
    later = [reconnect_delay(n) for n in range(2, 200) for _ in range(5)]
    assert all(0.25 <= d <= 0.5 for d in first)
    assert all(d <= 2.0 for d in later) and max(later) > 1.0
    assert len({round(d, 6) for d in first}) > 1


def test_auto_capacity_takes_the_scarcer_of_cpu_and_memory() -> None:
    budgets = Budgets(
        async_per_cpu=5000, async_budget_kb=64, processes_per_cpu=8, process_budget_mb=64, memory_fraction=0.5
    )
    roomy = auto_capacity(budgets, cpus=2, memory_mb=24_000)
    assert roomy.workers == 10_000 and roomy.process_slots == 16  # CPU-bound
    tight = auto_capacity(budgets, cpus=16, memory_mb=1000)
    assert tight.workers == 8000 and tight.process_slots == 7  # memory-bound: 500 MiB usable


def test_workers_auto_is_resolved_to_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_WORKERS_COUNT", "auto")
    settings, capacity = sized(ServiceSettings())
    assert capacity is not None and settings.workers_count == capacity.workers >= 1
    assert 0 <= settings.process_slots <= settings.workers_count
    monkeypatch.setenv("ORCH_WORKERS_COUNT", "12")
    monkeypatch.setenv("ORCH_PROCESS_SLOTS", "3")
    assert sized(ServiceSettings()) == (ServiceSettings(), None)
    with pytest.raises(ValueError):
        ServiceSettings(workers_count=-5)


def test_kind_references_and_builtin_discovery() -> None:
    assert load_ref("shared.kinds.ticker:KIND") is BUILTIN_KINDS["ticker"]
    with pytest.raises(ValueError):
        load_ref("no-colon")
    with pytest.raises(TypeError):
        load_ref("shared.kinds:BUILTIN_REFS")
    assert set(BUILTIN_KINDS) <= set(discover_kinds())


def _catalog() -> KindCatalog:
    echo = KindInfo(
        name="echo",
        args_schema={
            "type": "object",
            "properties": {"message": {"type": "string", "minLength": 1}},
            "required": ["message"],
            "additionalProperties": False,
        },
    )
    kinds = {"echo": OfferedKind(echo, {"default"}, 1), "ticker": OfferedKind(BUILTIN_KINDS["ticker"].info())}
    return KindCatalog(kinds, {"default", "gpu"})


def test_new_observers_are_validated_against_the_announced_kinds() -> None:
    catalog, default = _catalog(), RetryPolicy()
    ok = validate(NewObserver("a", "echo", {"message": "hi"}, retry={"max_attempts": None}), catalog, default)
    assert ok.retry is not None and ok.retry["max_attempts"] is None and ok.retry["factor"] == default.factor
    with pytest.raises(Invalid, match="message"):
        validate(NewObserver("a", "echo", {}), catalog, default)
    with pytest.raises(Invalid, match="unknown observer kind 'nope'"):
        validate(NewObserver("a", "nope", {}), catalog, default)
    with pytest.raises(Invalid, match="no live service of pool 'gpu' offers kind 'echo'"):
        validate(NewObserver("a", "echo", {"message": "x"}, pool="gpu"), catalog, default)
    with pytest.raises(Unavailable, match="no live observer service serves pool 'other'"):
        validate(NewObserver("a", "ticker", {}, pool="other"), catalog, default)
    with pytest.raises(Invalid, match=r"retry\.factor"):
        validate(NewObserver("a", "ticker", {}, retry={"factor": 0.5}), catalog, default)
    with pytest.raises(Invalid, match="interval_s"):
        validate(NewObserver("a", "ticker", {"interval_s": 0}), catalog, default)


def test_args_must_suit_every_schema_announced_in_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A service narrows ``periodic`` to its ORCH_PERIODIC_MODULES; any service of the pool may
    take the start, so the manager holds args to each schema announced there."""
    periodic = BUILTIN_KINDS["periodic"]
    monkeypatch.setenv("ORCH_PERIODIC_MODULES", "")
    calls_nothing = periodic.announced_info()
    monkeypatch.setenv("ORCH_PERIODIC_MODULES", "myjobs")
    calls_myjobs = periodic.announced_info()
    offered = OfferedKind(calls_myjobs)
    offered.announced_by(["jobs", "mixed"], calls_myjobs)
    offered.announced_by(["mixed", "strict"], calls_nothing)
    catalog, default = KindCatalog({"periodic": offered}, {"jobs", "mixed", "strict"}), RetryPolicy()

    def create(function: str, pool: str) -> NewObserver:
        return validate(NewObserver("p", "periodic", {"function": function}, pool=pool), catalog, default)

    assert create("myjobs.daily:run", "jobs").args["function"] == "myjobs.daily:run"
    with pytest.raises(
        Invalid, match=r"function: only .* ORCH_PERIODIC_MODULES may be called: myjobs \(got 'os:system'\)"
    ):
        create("os:system", "jobs")
    for pool in ("mixed", "strict"):
        with pytest.raises(Invalid, match="function: this service calls no function: ORCH_PERIODIC_MODULES is unset"):
            create("myjobs.daily:run", pool)
    with pytest.raises(Invalid, match="interval_s"):  # the built-in's own model still answers first
        validate(NewObserver("p", "periodic", {"function": "myjobs:f", "interval_s": 0}, pool="jobs"), catalog, default)


async def test_the_watchdog_names_the_observer_that_blocks_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    watchdog = LoopWatchdog(period_s=0.05, stall_s=0.3)
    watchdog.start()

    async def blocking_observer() -> None:
        time.sleep(0.8)  # noqa: ASYNC251 - what an async observer must never do

    try:
        with caplog.at_level(logging.WARNING, logger="observer_service.watchdog"):
            await asyncio.create_task(blocking_observer(), name="observer 1234")
            await asyncio.sleep(0.2)
    finally:
        watchdog.stop()
    assert watchdog.take_lag() >= 500
    assert any("blocked" in r.message and "by observer 1234" in r.message for r in caplog.records), caplog.text
    assert "test_runtime_unit.py" in caplog.text  # the line it is stuck on
    assert "saturated" not in caplog.text  # one observer, not many
    # and, once it runs again, how long the stall lasted in all
    ended = [r.message for r in caplog.records if "ran again after a stall of" in r.message]
    assert len(ended) == 1 and float(ended[0].rsplit(" ", 1)[1].rstrip("s")) >= 0.7, caplog.text


async def test_the_watchdog_tells_a_saturated_loop_from_one_blocking_observer(caplog: pytest.LogCaptureFixture) -> None:
    # Many observers with a little work each, all ready in one pass: no single one blocks.
    watchdog = LoopWatchdog(period_s=0.05, stall_s=0.3)
    watchdog.start()

    async def busy_observer() -> None:
        time.sleep(0.002)  # noqa: ASYNC251 - a slice of CPU work, as a busy observer's

    try:
        with caplog.at_level(logging.WARNING, logger="observer_service.watchdog"):
            await asyncio.gather(*(asyncio.create_task(busy_observer(), name=f"observer {n}") for n in range(600)))
            await asyncio.sleep(0.2)
    finally:
        watchdog.stop()
    assert "event loop saturated, not blocked by one observer" in caplog.text, caplog.text


def test_a_process_that_was_not_running_is_told_from_a_blocked_loop() -> None:
    # 20 s in which the process used 10 ms of CPU: stopped (SIGSTOP) or starved by the host
    assert process_paused(20.0, 0.01, stall_s=1.0)
    # a loop blocked by CPU work, or a thread the GIL kept waiting: the CPU time is there
    assert not process_paused(20.0, 19.0, stall_s=1.0)
    # too short to be a stall at all
    assert not process_paused(0.5, 0.0, stall_s=1.0)


def test_gc_policy_freezes_bursts_and_unfreezes_after_churn_or_a_fence() -> None:
    policy = GcPolicy()
    gc.unfreeze()
    try:
        policy.started(FREEZE_EVERY - 1)
        assert gc.get_freeze_count() == 0
        policy.burst_done()  # the end of a burst freezes what it started
        assert gc.get_freeze_count() > 0
        garbage = _frozen_garbage()
        policy.ended(10, running=100_000)  # a few stops: frozen cycles are tolerable
        assert garbage() is not None
        policy.ended(100_000, running=100_000)  # the whole population churned: collect
        assert garbage() is None
        assert gc.get_freeze_count() > 0  # and what lives is frozen again

        policy.started(FREEZE_EVERY)
        garbage = _frozen_garbage()
        gc.collect()
        assert garbage() is not None  # frozen cycles survive a collection...
        policy.fenced()
        assert garbage() is None  # ...until a fence unfreezes and collects
    finally:
        gc.unfreeze()


class _Cycle:
    def __init__(self) -> None:
        self.me = self
        self.payload: bytearray | None = None


def _frozen_garbage() -> weakref.ref[_Cycle]:
    """A cycle frozen while alive (as an observer's objects are), then dropped."""
    garbage = _Cycle()
    gc.freeze()
    return weakref.ref(garbage)


async def test_gc_policy_freezes_what_lives_long_outside_bursts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Long-lived objects made outside a burst of starts (observers resumed after a lapsed
    lease, a reconnect) are frozen within a period, so no automatic full collection walks
    them (at 1,000,000 held, such collections paused services past the AMQP heartbeat)."""
    monkeypatch.setattr(gc_policy, "FREEZE_PERIOD_S", 0.01)
    policy = GcPolicy()
    gc.unfreeze()
    gc.collect()
    maintaining = asyncio.create_task(policy.maintain(lambda: 0))
    try:
        kept = [[i] for i in range(10_000)]  # long-lived, made after the last freeze
        assert any(o is kept[0] for o in gc.get_objects())
        await asyncio.sleep(0.1)
        assert not any(o is kept[0] for o in gc.get_objects()), "still walked by collections"
        with policy.burst():  # a burst freezes by itself: the period leaves it alone
            during = [[i] for i in range(10)]
            await asyncio.sleep(0.1)
            assert any(o is during[0] for o in gc.get_objects())
    finally:
        maintaining.cancel()
        gc.unfreeze()


def test_gc_policy_collects_frozen_garbage_that_grows_while_the_load_holds() -> None:
    policy = GcPolicy()
    gc.unfreeze()
    try:
        gc.collect()
        gc.freeze()
        baseline = resident_bytes()
        assert baseline is not None
        policy.check_for_leaks(running=1000)  # the reference
        garbage = _frozen_garbage_of(baseline // 5)  # +20 %
        policy.check_for_leaks(running=1050)  # below the growth that looks like a leak
        assert all(g() is not None for g in garbage)
        grown = _frozen_garbage_of(baseline)  # about twice the reference
        policy.check_for_leaks(running=3000)  # as many more observers: growth explained
        assert all(g() is not None for g in grown)
        more = _frozen_garbage_of(2 * baseline)
        policy.check_for_leaks(running=3100)  # the load held, the memory did not
        assert all(g() is None for g in garbage + grown + more)
    finally:
        gc.unfreeze()


def test_gc_policy_leak_check_does_not_walk_the_frozen_objects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting frozen objects walks them all: seconds at 333,000 emitting observers."""

    def walks() -> int:
        raise AssertionError("gc.get_freeze_count walks every frozen object")

    monkeypatch.setattr(gc, "get_freeze_count", walks)
    policy = GcPolicy()
    policy.check_for_leaks(running=10)
    policy.check_for_leaks(running=10)


def _frozen_garbage_of(size: int) -> list[weakref.ref[_Cycle]]:
    """Cycles of about ``size`` bytes in all (resident: the bytes are written), frozen while
    alive, then dropped."""
    chunk = 1 << 20
    cycles = [_Cycle() for _ in range(max(size // chunk, 1))]
    for cycle in cycles:
        cycle.payload = bytearray(b"x" * chunk)
    gc.freeze()
    return [weakref.ref(c) for c in cycles]


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
    outbox.put(ObserverStarted(observer_id=uuid.uuid4(), service_id=service), dead)
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
    outbox.put(ObserverStarted(observer_id=observer, service_id=service), dead)  # the older form
    outbox.put(ServiceInventory(service_id=service, observer_ids=[observer]), dead)
    outbox.put(ObserverStopped(observer_id=observer, service_id=service), dead)  # an ack was sent: keep
    outbox.put(StartedReport(observer, service, uuid.uuid4(), False, "async"), live)
    outbox.put(ServiceHeartbeat(service_id=service, running=1))
    assert outbox.discard_started(dead) == 3
    kept = await outbox.peek_batch(10)
    assert [type(m).__name__ for m in kept] == ["ObserverStopped", "StartedReport", "ServiceHeartbeat"]


class _NoArgs(BaseModel):
    pass


async def test_an_ended_observer_is_freed_by_reference_counting_alone() -> None:
    """Stopped observers must not wait for the collector (frozen by the GC policy, they
    would stay): the task that ran one, what ended it and the observer itself are freed
    by reference counting alone, whether its body was cancelled or raised."""
    runner = Runner.__new__(Runner)  # only _on_ended is exercised

    async def cancelled_body(args: object, ctx: object) -> None:
        await asyncio.sleep(3600)

    async def raising_body(args: object, ctx: object) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    # pytest keeps every log record, and the warning about the raising body carries its
    # traceback (and through it the observer): that logger is not what this test is about.
    logging.getLogger("observer.x").propagate = False
    for body in (cancelled_body, raising_body):
        loaded = LoadedKind(ObserverKind(name="x", args_model=_NoArgs, run=body), "tests:x")
        oid = uuid.uuid4()
        ctx = Context(oid, "x", "x", uuid.uuid4(), None)  # type: ignore[arg-type]
        running = Running(oid, b"{}", None, 1, None, ctx)  # type: ignore[arg-type]
        running.ended_by = "stop"
        settings = ServiceSettings()
        gc.disable()
        try:
            running.task = asyncio.create_task(
                supervise(running, loaded, _NoArgs(), settings, Outbox(), runner._on_ended)
            )
            await asyncio.sleep(0)
            if body is cancelled_body:
                running.task.cancel()
            for _ in range(3):
                await asyncio.sleep(0)
            assert running.task is None, "the task did not tell the runner it ended"
            ref = weakref.ref(running)
            del running
            assert ref() is None, f"an ended observer ({body.__name__}) is kept alive by a reference cycle"
        finally:
            gc.enable()


def test_gc_policy_keeps_automatic_collection_off_during_a_burst_only() -> None:
    policy = GcPolicy()
    assert gc.isenabled()
    with policy.burst():
        assert not gc.isenabled()  # no automatic full collection can pause the burst
        policy.started(FREEZE_EVERY)  # the young generations are still collected by hand
    assert gc.isenabled()
    try:
        with policy.burst():
            raise RuntimeError("a start that blew up")
    except RuntimeError:
        pass
    assert gc.isenabled()
    gc.unfreeze()


async def test_observers_paused_by_a_lapsed_lease_wait_on_it_without_a_timer_each() -> None:
    """A failover's burst of starts lapses the lease; every observer started meanwhile waits
    for it. They must wait on the lease, not poll it: 100,000 polling timers starved the loop
    that would read the renewal (a failover of 100,000 took 285 s)."""
    lease = Lease(heartbeat_s=0.2)
    lease.renew(time.monotonic() - 1)  # lapsed
    session = SimpleNamespace(closed=asyncio.Event(), lease=lease)

    def paused(count: int) -> list[asyncio.Task[None]]:
        contexts = [Context(uuid.uuid4(), "x", "x", uuid.uuid4(), session) for _ in range(count)]  # type: ignore[arg-type]
        return [asyncio.create_task(_lease_back(c)) for c in contexts]

    waiting = paused(1_000)
    await asyncio.sleep(0.3)
    assert not any(task.done() for task in waiting)
    assert len(asyncio.get_running_loop()._scheduled) < 100  # type: ignore[attr-defined]

    lease.renew(time.monotonic())  # renewed: all resume
    await asyncio.wait_for(asyncio.gather(*waiting), 5)

    lease = session.lease = Lease(heartbeat_s=0.2)  # the next session's lease: lapsed again
    lease.renew(time.monotonic() - 1)
    waiting = paused(100)
    await asyncio.sleep(0.05)
    session.closed.set()  # the session dies (Session.fail revokes the lease): all give up
    lease.revoke()
    results = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 5)
    assert all(isinstance(r, LeaseLost) for r in results)


async def test_starts_wait_for_a_lapsed_lease_then_start_once_it_is_back() -> None:
    """Deliveries that arrive while the lease is lapsed are not started until it is renewed:
    started, each observer only parked itself on the lease (an exception, a shielded waiter
    and a restart each), which made a failover on a saturated machine cost twice as much per
    start on the service's loop as the same failover on a quiet one. Once the lease is back
    they all start; the starts of a session that dies meanwhile are skipped."""
    lease = Lease(heartbeat_s=0.2)
    lease.renew(time.monotonic() - 1)  # lapsed
    session = _FakeSession(lease)
    outbox = Outbox()
    runner = Runner(ServiceSettings(), uuid.uuid4(), outbox, {"idle": discover_kinds()["idle"]})

    def deliver(count: int, to: _FakeSession) -> None:
        for tag in range(count):
            body = StartObserver(observer_id=uuid.uuid4(), name=f"o{tag}", kind="idle").model_dump_json()
            runner.on_start(body.encode(), None, tag, False, to)  # type: ignore[arg-type]

    deliver(50, session)
    await asyncio.sleep(0.3)
    assert len(runner.running) == 0 and len(outbox) == 0, "started (and reported) while the lease was lapsed"

    lease.renew(time.monotonic())
    await _until(lambda: len(runner.running) == 50)
    await asyncio.sleep(0.05)
    assert lease._change is None, "a started observer is parked on the lease"
    assert len(outbox) == 50

    lapsed = Lease(heartbeat_s=0.2)  # the next session's lease: lapsed again
    lapsed.renew(time.monotonic() - 1)
    gone = _FakeSession(lapsed)
    deliver(20, gone)
    await asyncio.sleep(0.05)
    assert runner._draining  # waiting for the lease
    gone.closed.set()  # the session dies (Session.fail revokes the lease too)
    lapsed.revoke()
    await _until(lambda: not runner._draining)
    assert len(runner.running) == 50, "a start of a dead session was started"
    session.closed.set()  # the end of the first session ends its observers quietly
    for running in list(runner.running.values()):
        assert running.task is not None
        running.task.cancel()
    await asyncio.sleep(0.05)


async def test_an_observer_that_meets_a_revoked_lease_leaves_the_session_its_own_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The holding thread revokes the lease as soon as it finds the connection gone, and
    posts the session's end, with the broker's reason, to the main loop. An observer that
    meets the revoked lease first must not end the session itself: it did, with "observer X
    hit a lapsed lease" as an ERROR and as the session's reason (a service SIGSTOPped for
    20 s while 22,500 tickers emitted), blaming one observer for a closed connection."""
    lease = Lease(heartbeat_s=10)
    lease.renew(time.monotonic())
    session = _FakeSession(lease)
    failed: list[str] = []
    session.fail = lambda reason, exc=None: failed.append(reason)  # type: ignore[attr-defined]
    runner = Runner.__new__(Runner)  # only _on_ended is exercised

    async def acting_body(args: object, ctx: ObserverContext) -> None:
        while True:
            ctx.ensure_lease()
            await asyncio.sleep(0.01)

    loaded = LoadedKind(ObserverKind(name="x", args_model=_NoArgs, run=acting_body), "tests:x")
    oid = uuid.uuid4()
    ctx = Context(oid, "x", "x", uuid.uuid4(), session)  # type: ignore[arg-type]
    running = Running(oid, b"{}", None, 1, session, ctx)  # type: ignore[arg-type]
    running.task = asyncio.create_task(
        supervise(running, loaded, _NoArgs(), ServiceSettings(), Outbox(), runner._on_ended)
    )
    await asyncio.sleep(0.05)
    with caplog.at_level(logging.INFO, logger="observer_service.runner"):
        lease.revoke()  # the connection is gone; the session's end is still on its way
        await _until(lambda: running.task is None)
    assert failed == [] and "hit a lapsed lease" not in caplog.text, (failed, caplog.text)


class _FakeSession:
    """What the runner reads of a session: whether it is gone, its lease, its id (hashable:
    the held observers are counted per session)."""

    def __init__(self, lease: Lease) -> None:
        self.closed = asyncio.Event()
        self.lease = lease
        self.id = uuid.uuid4()


async def _until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_emit_slots_serve_waiters_in_order_and_skip_the_cancelled() -> None:
    slots = Slots(2)
    served: list[int] = []

    async def emit(n: int) -> None:
        await slots.acquire()
        served.append(n)

    await slots.acquire()
    await slots.acquire()
    assert slots.full()
    waiting = [asyncio.create_task(emit(n)) for n in range(4)]
    await asyncio.sleep(0)
    waiting[1].cancel()  # gives up while it waits: its turn is skipped
    await asyncio.sleep(0)
    slots.release()  # both of ours: to 0 and 2
    slots.release()
    slots.release()  # 0's: to 3
    await asyncio.gather(*waiting, return_exceptions=True)
    assert served == [0, 2, 3]
    # A waiter handed a slot as it is cancelled passes the slot on: none is lost.
    late = asyncio.create_task(emit(9))
    await asyncio.sleep(0)
    slots.release()  # 2's: to the late one, which is cancelled before it runs
    late.cancel()
    await asyncio.gather(late, return_exceptions=True)
    assert served == [0, 2, 3] and not slots.full()
    slots.release()  # 3's: both slots free again
    for _ in range(2):
        await asyncio.wait_for(slots.acquire(), 1)
    assert slots.full()


async def test_emit_slots_stay_cheap_when_waiters_deep_in_the_queue_give_up() -> None:
    """A stop or a fence cancels observers by the ten thousand while hundreds of thousands
    wait for an emit slot, in no particular order. asyncio.Semaphore (3.11) removes each
    cancelled waiter from its deque by value: 20,000 of 200,000 cancelled from the back
    keep the loop busy for over two minutes here (141 s), and the service's
    publishing connection silent with it (make bench-scale, 1,000,000 emitting). Here a
    cancelled turn is skipped when it comes."""
    slots = Slots(1)
    await slots.acquire()
    waiting = [asyncio.create_task(slots.acquire()) for _ in range(200_000)]
    await asyncio.sleep(0)
    given_up = waiting[::-1][:20_000]
    began = time.monotonic()
    for task in given_up:
        task.cancel()
    await asyncio.gather(*given_up, return_exceptions=True)
    # A generous bound (it takes well under a second): the loop runs every cancelled
    # waiter's cleanup in one pass, so a timeout could not even fire before they are done.
    assert time.monotonic() - began < 30, "cancelled emit waiters held the event loop"
    for _ in range(180_000):
        slots.release()  # each to the next live waiter, in order
    await asyncio.wait_for(asyncio.gather(*waiting[:180_000]), 30)
    assert slots.full()
    slots.release()  # skips the 20,000 given up: the slot is free
    assert not slots.full()


def test_held_keeps_each_sessions_digest_as_observers_come_and_go() -> None:
    # The digest a service sends is kept up to date as observers are added and removed
    # instead of walking all of them every period: it must always equal digest_of over what
    # each session really holds, whatever the order of adds, replacements and removes.
    rng = random.Random(17)
    held = Held()
    sessions = [object(), object(), object()]
    ids = [uuid.uuid4() for _ in range(300)]
    for _ in range(5_000):
        oid = rng.choice(ids)
        if rng.random() < 0.6:
            session = rng.choice(sessions)
            held.add(Running(oid, b"{}", None, 1, session, None))  # type: ignore[arg-type]
        else:
            held.remove(oid)
        if rng.random() < 0.05:
            for session in sessions:
                mine = [r.observer_id for r in held.values() if r.session is session]
                assert held.digest(session) == (len(mine), digest_of(mine))
    assert len(held) == len({r.observer_id for r in held.values()})
    for session in sessions:
        mine = [r.observer_id for r in held.values() if r.session is session]
        assert held.digest(session) == (len(mine), digest_of(mine))
    assert held.digest(object()) == (0, digest_of([]))
