"""Broadcast stops of observers this service does not run, remembered for a while: the
start may be on its way here (the observer was being moved when the stop went out).

A remembered stop eats the start of the life it stopped, or of an older one, never a newer
life (a ``Failed`` observer restarted since): lives are numbered by the manager on the row,
so the comparison does not depend on the clocks of the manager and this host.
"""

from __future__ import annotations

import time
import uuid


class StopMemory:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        # id -> (expiry (monotonic), the life stopped); ordered by expiry (the TTL is shared).
        self._stopped: dict[uuid.UUID, tuple[float, int]] = {}

    def remember(self, observer_id: uuid.UUID, life: int) -> None:
        self._stopped.pop(observer_id, None)  # re-inserted last, to keep the expiry order
        self._stopped[observer_id] = (time.monotonic() + self.ttl_s, life)

    def eats(self, observer_id: uuid.UUID, life: int) -> bool:
        """Whether a remembered stop concerns this life of the observer (and forget it)."""
        now = time.monotonic()
        while self._stopped:
            oldest, (expiry, _) = next(iter(self._stopped.items()))
            if expiry >= now:
                break
            del self._stopped[oldest]
        remembered = self._stopped.pop(observer_id, None)
        return remembered is not None and remembered[1] >= life
