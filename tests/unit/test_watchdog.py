"""``observer_service.watchdog``: the loop watchdog names a blocking observer, tells a
saturated loop from it, and a paused process from both."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from observer_service.watchdog import LoopWatchdog, process_paused


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
    assert "test_watchdog.py" in caplog.text  # the line it is stuck on
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
