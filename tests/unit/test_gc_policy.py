"""``observer_service.gc_policy``: when the collector is frozen, unfrozen and run."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from observer_service import gc_policy
from observer_service.gc_policy import FREEZE_EVERY, GcPolicy, resident_bytes


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
