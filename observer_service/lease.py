"""The fencing lease (docs/design.md, "Pauses and the lease").

The broker declares a silent connection dead about H seconds (the AMQP heartbeat) after it
last heard from it, and only then hands its deliveries to another service. So if a round trip
*sent* at time t was confirmed by the broker, nobody else can run our observers before
about t + H. We call the lease valid while ``now - t < H/2``: a process that was frozen
(SIGSTOP, GC pause, swapped out) wakes up with a lapsed lease and must not act until it has
dropped its session and started over.

The lease is renewed on the holding connection's thread (``holding.py``) and read and waited
for on the main loop: the instants are floats (one write, one read, each atomic), and the
waiters' future is resolved on the loop it belongs to (``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from shared import topology
from shared.errors import LeaseLost


class Lease:
    def __init__(self, heartbeat_s: float, *, cluster: bool = False) -> None:
        # On a cluster a quorum queue hands a dead node's deliveries on after
        # ``HAND_ON_AFTER_MS`` whatever H is: the lease must lapse well before that
        # (docs/design.md, "How soon the starts of a dead node may move").
        self.validity_s = min(heartbeat_s / 2, topology.HAND_ON_AFTER_MS / 2000) if cluster else heartbeat_s / 2
        self._renewed_at: float | None = None
        # A round trip sent before the last revocation proves nothing about the session
        # that follows it (the old one's was still under way when it was given up).
        self._revoked_at = 0.0
        # Resolved at the next renewal or revocation: what paused observers wait on.
        self._change: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def renew(self, sent_at: float) -> None:
        """Record a confirmed round trip that was sent at ``sent_at`` (monotonic). Any thread."""
        if sent_at <= self._revoked_at:
            return
        if self._renewed_at is None or sent_at > self._renewed_at:
            self._renewed_at = sent_at
        self._wake()

    async def changed(self) -> None:
        """Until the next renewal or revocation. Every observer paused by a lapsed lease
        waits on this one future: a timer each to poll the lease floods the loop in a
        failover, which then reads the broker's replies so late that the lease keeps lapsing
        (figures: docs/design.md, "Pauses and the lease"). A cancelled waiter does not cancel
        the others' future (``shield``)."""
        if self._change is None:
            self._loop = asyncio.get_running_loop()
            self._change = self._loop.create_future()
        change = self._change
        # Renewed or revoked (on the other thread) before the future was there to wake.
        if self.is_valid() or self._renewed_at is None:
            return
        await asyncio.shield(change)

    def _wake(self) -> None:
        loop = self._loop
        if self._change is None or loop is None:
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            self._resolve()
        else:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        change, self._change = self._change, None
        if change is not None and not change.done():
            change.set_result(None)

    @property
    def renewed_at(self) -> float | None:
        return self._renewed_at

    def revoke(self) -> None:
        """Any thread."""
        self._revoked_at = time.monotonic()
        self._renewed_at = None
        self._wake()

    def revoked(self) -> bool:
        """Revoked and not renewed since: the session is ending (or ended)."""
        return self._renewed_at is None and self._revoked_at > 0

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
                f"lease lapsed {-remaining:.3f}s ago: this service may no longer own its observers"
                if self._renewed_at is not None
                else "no lease: the service is not connected to the broker"
            )
