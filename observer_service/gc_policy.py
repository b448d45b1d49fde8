"""Keeping the garbage collector's pauses short in a service that holds tens of thousands of
observers: a full collection walks all of them, long enough on a busy machine to let the
fencing lease lapse (figures: docs/design.md, "Pauses and the lease").

The objects of running observers live long and rarely become garbage, yet every full
collection walks all of them. So after each burst of starts the survivors are *frozen*
(``gc.freeze``: moved to a generation the collector never walks), after a young collection
has freed that burst's own cyclic garbage. Frozen objects are still freed by reference
counting; only frozen *cycles* would stay, so:

* a fence unfreezes everything and collects in full before the service reconnects, when it
  holds no lease that a pause could break (the fenced observers' cancelled tasks are cycles);
* an ended observer is freed by reference counting (the runner breaks its one cycle), so
  stops leave little behind; only after stops have ended as many observers as now run is
  everything unfrozen, so the collector frees what cycles remain (one long pass, rarely).

Starts are not the only source of long-lived objects: observers paused by a lapsed lease
make new frames and futures when it is renewed, reconnects and stops make their own. Left in
the oldest generation, every automatic full collection walks them, and with hundreds of
thousands held the pauses outlast the broker's heartbeat timeout. So ``maintain`` also
freezes every ``FREEZE_PERIOD_S`` whatever survived a young collection: an automatic full
collection then walks about one period's survivors, never the whole population.

What that costs: a cycle alive at a freeze and garbage later stays until the next full
collection. ``maintain`` watches for that: every ``LEAK_CHECK_S`` it reads the process's
resident memory, and when it grew by half while the number of observers did not (the growth
is not new observers, so it is likely frozen garbage) it unfreezes and collects in full.
Memory, not ``gc.get_freeze_count``: that walks the frozen list and blocked the loop for
seconds per check (figures: docs/design.md, "Pauses and the lease").
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator

from shared.gc_pause import paused_collection
from shared.linux import statm_resident_bytes

logger = logging.getLogger(__name__)

FREEZE_EVERY = 1000  # starts between freezes within one burst
# The end of a burst freezes only if it started this many: deliveries that trickle in end a
# "burst" every few starts, and a young collection each time costs too much (figures:
# docs/design.md, "Pauses and the lease"). A trickle is frozen with the next burst.
BURST_FREEZE_MIN = 100
FREEZE_PERIOD_S = 1.0
LEAK_CHECK_S = 300.0
# Resident memory may grow this much while the observer count holds before a full collection.
LEAK_GROWTH = 1.5
# The observer count "holds" within this fraction; past it the growth is new observers.
STEADY_WITHIN = 0.1


class GcPolicy:
    def __init__(self) -> None:
        self._since_freeze = 0
        self._ended_frozen = 0  # observers ended since the last unfreeze
        self._in_burst = False
        # (resident bytes, observers running) at the last leak check
        self._reference: tuple[int, int] | None = None

    @contextlib.contextmanager
    def burst(self) -> Iterator[None]:
        """No automatic collection while a burst of starts runs: ``started`` collects the young
        generations every ``FREEZE_EVERY`` starts anyway, and a full collection in the middle
        of a burst is a long pause (docs/design.md, "Pauses and the lease")."""
        self._in_burst = True
        try:
            with paused_collection():
                yield
        finally:
            self._in_burst = False

    def started(self, count: int = 1) -> None:
        self._since_freeze += count
        if self._since_freeze >= FREEZE_EVERY:
            self.freeze()

    def burst_done(self) -> None:
        if self._since_freeze >= BURST_FREEZE_MIN:
            self.freeze()

    def freeze(self) -> None:
        gc.collect(1)  # the young generations only: this burst's own cycles
        gc.freeze()
        self._since_freeze = 0

    def ended(self, count: int, running: int) -> None:
        """Observers stopped while the service keeps its session."""
        self._ended_frozen += count
        if self._ended_frozen >= max(FREEZE_EVERY, running):
            self._collect_all(f"{self._ended_frozen} observers ended, {running} run")

    def fenced(self) -> None:
        """Every observer of the session is gone and no lease is held: collect now."""
        self._collect_all("after the fence")

    async def maintain(self, running: Callable[[], int]) -> None:
        """Freeze each period's survivors; collect in full when frozen garbage piles up."""
        checked = time.monotonic()
        while True:
            await asyncio.sleep(FREEZE_PERIOD_S)
            if self._in_burst:
                continue  # the burst freezes as it goes
            self.freeze()
            if time.monotonic() - checked >= LEAK_CHECK_S:
                checked = time.monotonic()
                self.check_for_leaks(running())

    def check_for_leaks(self, running: int) -> None:
        resident = resident_bytes()
        if resident is None:
            return  # no /proc (not Linux): no check
        reference, self._reference = self._reference, (resident, running)
        if reference is None:
            return
        resident_before, running_before = reference
        if abs(running - running_before) > STEADY_WITHIN * max(running_before, 1):
            return  # the growth is new (or fewer) observers: the new size is the reference
        if resident > LEAK_GROWTH * resident_before:
            grew = f"resident memory grew from {resident_before >> 20} to {resident >> 20} MiB"
            self._collect_all(f"{grew} while {running} observers ran")
            # Freed memory may stay mapped (the allocator keeps it): measure from here.
            self._reference = (resident_bytes() or resident, running)

    def _collect_all(self, why: str) -> None:
        started = time.perf_counter()
        gc.unfreeze()
        freed = gc.collect()
        gc.freeze()
        self._ended_frozen = self._since_freeze = 0
        logger.info("collected %d objects (%s) in %.0f ms", freed, why, (time.perf_counter() - started) * 1000)


def resident_bytes() -> int | None:
    """This process's resident memory, from ``/proc/self/statm`` (a read of one small file)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return statm_resident_bytes(f.read())
    except (OSError, ValueError, IndexError):
        return None
