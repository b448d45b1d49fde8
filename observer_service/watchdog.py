"""Event-loop lag, and who causes it.

An ``async`` observer that blocks (CPU work, a synchronous call) stalls every observer of its
service, the lease round trip and the AMQP heartbeats. The loop side measures how late a
periodic callback runs (``lag_ms``, reported in heartbeats). A watchdog *thread* looks at the
loop while it is stalled: the task the loop is running at that moment is the culprit, and
observer tasks are named ``observer <id>``, so the warning names the observer and the line
it is stuck on.

A loop can also stand still because the whole process did: stopped (SIGSTOP, a paused VM)
or given no CPU by an overloaded host. Then no observer is to blame, and naming the one that
happened to run when the process was frozen would send operators after a healthy one
(docs/design.md, "Pauses and the lease"). The watchdog tells the two apart by the process's
CPU time: a loop blocked by an observer runs (CPU work) or waits in a call while the
watchdog's own thread keeps its period; a process that was not running shows a gap in the
watchdog's period with almost no CPU time spent in it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time

logger = logging.getLogger(__name__)


# A stretch of wall time in which the process used less than this share of it in CPU time
# (all its threads): the process itself was not running (stopped, or starved by the host).
_PAUSED_CPU_SHARE = 0.25


def process_paused(wall_s: float, cpu_s: float, stall_s: float) -> bool:
    """Whether ``wall_s`` seconds (a watchdog period's overrun, a collection) in which the
    process used ``cpu_s`` of CPU time show the process itself not running, for at least
    ``stall_s``."""
    return wall_s >= stall_s and cpu_s < _PAUSED_CPU_SHARE * wall_s


class GcPauses:
    """Times the garbage collector's full (generation 2) passes: with tens of thousands of
    observers in one process they are the longest pauses of the event loop. A pass the
    process was stopped in (its CPU time short of the wall time, ``process_paused``) is not
    reported as long: the watchdog says the process was not running."""

    def __init__(self, warn_ms: float = 200.0) -> None:
        self.warn_ms = warn_ms
        self.collecting = False
        self._started = 0.0
        self._cpu = 0.0

    def install(self) -> None:
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self.collecting = True
            self._started, self._cpu = time.perf_counter(), time.process_time()
            return
        self.collecting = False
        pause_s = time.perf_counter() - self._started
        if pause_s * 1000 < self.warn_ms or process_paused(
            pause_s, time.process_time() - self._cpu, self.warn_ms / 1000
        ):
            return
        logger.warning(
            "full garbage collection paused the loop for %.0f ms (%d objects freed)",
            pause_s * 1000,
            info.get("collected", 0),
        )


class LoopWatchdog:
    def __init__(self, period_s: float = 0.25, stall_s: float = 1.0, gc_pauses: GcPauses | None = None) -> None:
        self.gc_pauses = gc_pauses
        self.period_s = period_s
        self.stall_s = stall_s
        self.lag_ms = 0.0  # the worst lag since the last ``take_lag``
        self._last_tick = time.monotonic()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._last_tick = time.monotonic()
        self._loop.call_later(self.period_s, self._tick, self._last_tick + self.period_s)
        threading.Thread(target=self._watch, name="loop-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def last_tick(self) -> float:
        """The monotonic instant the loop last ran this watchdog's callback (any thread)."""
        return self._last_tick

    def take_lag(self) -> float:
        lag, self.lag_ms = self.lag_ms, 0.0
        return lag

    def _tick(self, due: float) -> None:
        now = time.monotonic()
        self.lag_ms = max(self.lag_ms, (now - due) * 1000)
        self._last_tick = now
        if not self._stop.is_set() and self._loop is not None:
            self._loop.call_later(self.period_s, self._tick, now + self.period_s)

    def _watch(self) -> None:
        reported = 0.0  # the last tick before the stall being reported, 0 if none
        blamed: asyncio.Task[object] | None = None  # the task running when it was reported
        saturated = False  # said that other tasks ran in the same stall
        woke, cpu = time.monotonic(), time.process_time()
        resumed = 0.0  # when the process last ran again after not running at all
        while not self._stop.wait(self.period_s):
            woke_before, woke = woke, time.monotonic()
            cpu_before, cpu = cpu, time.process_time()
            overslept = woke - woke_before - self.period_s
            last_tick = self._last_tick
            if process_paused(overslept, cpu - cpu_before, self.stall_s):
                # The loop stood still with the rest of the process: nothing of its own to
                # blame. Its stall is counted from now on, once the loop had a chance to run.
                logger.warning(
                    "the whole service process was not running for %.1fs (stopped, or given no CPU by "
                    "the host): no observer is to blame",
                    overslept,
                )
                resumed = woke
                continue
            if reported and last_tick != reported:
                # Said once when it began; now how long it lasted, so that a loop stuck for
                # minutes does not read as a stall of just over ``stall_s``.
                logger.warning("event loop ran again after a stall of %.1fs", last_tick - reported)
                reported = 0.0
            stalled = time.monotonic() - max(last_tick, resumed)
            if stalled < self.stall_s:
                continue
            if reported == last_tick:
                # Still the same stall. Another task running now means one pass of the loop
                # runs many: it is saturated (more work than CPU), and the observer named
                # when the stall began is only one of many.
                running = self._current_task()
                if not saturated and running is not None and running is not blamed:
                    saturated = True
                    logger.warning(
                        "event loop saturated, not blocked by one observer: other tasks ran in the same "
                        "stall (more observer work than this service has CPU for)"
                    )
                continue
            reported, blamed, saturated = last_tick, self._current_task(), False
            logger.warning("event loop blocked for %.1fs %s", stalled, self._culprit())

    def _current_task(self) -> asyncio.Task[object] | None:
        return asyncio.current_task(self._loop) if self._loop is not None else None

    def _culprit(self) -> str:
        if self.gc_pauses is not None and self.gc_pauses.collecting:
            return "in a full garbage collection"
        task = self._current_task()
        frame = sys._current_frames().get(self._loop_thread_id)
        where = f" at {frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
        if task is None:
            return f"outside any task{where}"
        name = task.get_name()
        blame = f"by {name}" if name.startswith("observer ") else f"in task {name!r}"
        return f"{blame}{where} (an async observer must not block: use isolation 'process')"
