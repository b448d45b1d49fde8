"""The fencing lease (DESIGN.md, "Fencing").

The broker declares a silent connection dead about H seconds (the AMQP heartbeat) after it
last heard from it, and only then hands its deliveries to another host. So if a round trip
*sent* at time t was confirmed by the broker, nobody else can run our observers before
about t + H. We call the lease valid while ``now - t < H/2``: a process that was frozen
(SIGSTOP, GC pause, swapped out) wakes up with a lapsed lease and must not act until it has
dropped its session and started over.
"""

from __future__ import annotations

import time

from shared.errors import LeaseLost


class Lease:
    def __init__(self, heartbeat_s: float) -> None:
        self.validity_s = heartbeat_s / 2
        self._renewed_at: float | None = None

    def renew(self, sent_at: float) -> None:
        """Record a confirmed round trip that was sent at ``sent_at`` (monotonic)."""
        if self._renewed_at is None or sent_at > self._renewed_at:
            self._renewed_at = sent_at

    @property
    def renewed_at(self) -> float | None:
        return self._renewed_at

    def revoke(self) -> None:
        self._renewed_at = None

    def valid_until(self) -> float:
        """The monotonic instant the lease lapses (0 without one). ``time.monotonic`` is
        one clock for every process of the host, so child processes can use it too."""
        return 0.0 if self._renewed_at is None else self._renewed_at + self.validity_s

    def remaining_s(self) -> float:
        if self._renewed_at is None:
            return 0.0
        return self._renewed_at + self.validity_s - time.monotonic()

    def is_valid(self) -> bool:
        return self.remaining_s() > 0

    def ensure(self) -> None:
        remaining = self.remaining_s()
        if remaining <= 0:
            raise LeaseLost(
                f"lease lapsed {-remaining:.3f}s ago: this host may no longer own its observers"
                if self._renewed_at is not None
                else "no lease: the service is not connected to the broker"
            )
