"""The start log's bound (``observer_service/start_log.py``): at ``INFO`` a service logs the
first starts of every window one by one and counts the rest in one line, however the starts
are split into drains. Pure logic, in-process."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest

from observer_service.start_log import StartLog


def _counted(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [int(m.group(1)) for r in caplog.records if (m := re.match(r"started (\d+) more", r.getMessage()))]


async def test_a_window_logs_its_first_starts_and_counts_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="observer_service.start_log")
    log = StartLog(each=10, window_s=0.3)
    # 25 starts in drains of 5, the loop free in between, as a failover hands them over.
    levels = []
    for _ in range(5):
        levels += [log.level() for _ in range(5)]
        await asyncio.sleep(0)
    assert levels == [logging.INFO] * 10 + [logging.DEBUG] * 15
    assert _counted(caplog) == []  # the window is still open
    await asyncio.sleep(0.6)  # the window's timer closes it, with no start after it
    assert _counted(caplog) == [15]
    # A new window logs its first starts one by one again.
    assert [log.level() for _ in range(12)] == [logging.INFO] * 10 + [logging.DEBUG] * 2
    log.close()
    assert _counted(caplog) == [15, 2]


async def test_a_window_without_more_starts_than_the_bound_logs_no_count(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="observer_service.start_log")
    log = StartLog(each=10, window_s=0.1)
    assert [log.level() for _ in range(10)] == [logging.INFO] * 10
    await asyncio.sleep(0.3)
    log.close()
    assert _counted(caplog) == []


async def test_a_window_whose_timer_is_late_is_closed_by_the_next_start(caplog: pytest.LogCaptureFixture) -> None:
    """A busy loop runs the timer late: the first start after the window's end closes it."""
    caplog.set_level(logging.INFO, logger="observer_service.start_log")
    log = StartLog(each=2, window_s=0.05)
    assert [log.level() for _ in range(5)] == [logging.INFO] * 2 + [logging.DEBUG] * 3
    time.sleep(0.1)  # noqa: ASYNC251 - blocks the loop on purpose, as a long drain does: the timer cannot run
    assert _counted(caplog) == []
    assert [log.level() for _ in range(3)] == [logging.INFO] * 2 + [logging.DEBUG]
    assert _counted(caplog) == [3]
    log.close()
    assert _counted(caplog) == [3, 1]
