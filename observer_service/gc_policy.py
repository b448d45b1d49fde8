"""Keeping the garbage collector's pauses short in a service that holds tens of thousands of
observers (``make bench`` found full collections of 0.3-1.5 s: long enough, on a busy 2-core
machine, to let the fencing lease lapse, fence every observer and churn).

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
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator

logger = logging.getLogger(__name__)

FREEZE_EVERY = 1000  # starts between freezes within one burst
# The end of a burst freezes only if it started this many: deliveries that trickle in end a
# "burst" every few starts, and a young collection each time was 5 % of a service's time
# during a bulk create (make bench ARGS=--profile). A trickle is frozen with the next burst.
BURST_FREEZE_MIN = 100


class GcPolicy:
    def __init__(self) -> None:
        self._since_freeze = 0
        self._ended_frozen = 0  # observers ended since the last unfreeze

    @contextlib.contextmanager
    def burst(self) -> Iterator[None]:
        """No automatic collection while a burst of starts runs: ``started`` collects the young
        generations every ``FREEZE_EVERY`` starts anyway, and an automatic full collection in
        the middle of a failover's burst paused a service for 1.3 s (make bench)."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if enabled:
                gc.enable()

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
            gc.unfreeze()
            self._ended_frozen = 0

    def fenced(self) -> None:
        """Every observer of the session is gone and no lease is held: collect now."""
        started = time.perf_counter()
        gc.unfreeze()
        freed = gc.collect()
        gc.freeze()
        self._ended_frozen = self._since_freeze = 0
        logger.info("collected %d objects after the fence in %.0f ms", freed, (time.perf_counter() - started) * 1000)
