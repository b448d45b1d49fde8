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
import logging
import time
from collections.abc import Awaitable, Callable

from shared import topology
from shared.errors import LeaseLost

logger = logging.getLogger(__name__)


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


async def keep(
    lease: Lease,
    renew: Callable[[], Awaitable[None]],
    period: float,
    give_up_s: float | None,
    fail: Callable[[str, BaseException | None], None],
) -> None:
    """Renew ``lease`` every ``period``. A slow round trip is waited for, however long, never
    cancelled (aiormq closes the channel of a cancelled RPC) and never taken for a dead broker.

    A lapsed lease pauses the observers (``ensure_lease`` refuses) but does not end the
    session: a round trip that completes later on this same connection proves the broker
    never declared it dead (it would have closed it), so nothing was given to anyone else
    and the observers may go on. What ends a session is evidence that the connection is
    gone: the broker closing it, the socket, or aiormq's heartbeat check (no frame at all
    from the broker for 3 x (H + 1) s), each of which closes the connection and ends the
    session. Giving up on a round trip unanswered for H would end every session of a fleet
    whose broker is merely busy, and the requeues would make it busier still (docs/design.md,
    "Pauses and the lease"). On a cluster (``give_up_s`` set) a lease unrenewed that long
    does end it: no majority confirms this node's writes, and the queues may hand its
    starts on."""
    renewal: asyncio.Task[None] | None = None
    lapsed = False
    opened_at = time.monotonic()
    try:
        while True:
            if renewal is None or renewal.done():
                if renewal is not None and renewal.exception() is not None:
                    fail(f"lease round trip failed: {renewal.exception()!r}", None)
                    return
                renewal = asyncio.ensure_future(renew())
            await asyncio.wait({renewal}, timeout=period)
            unrenewed_s = time.monotonic() - (lease.renewed_at or opened_at)
            if give_up_s is not None and not lease.is_valid() and unrenewed_s > give_up_s:
                fail(
                    f"lease unrenewed for {unrenewed_s:.0f}s: no majority of the cluster confirms this "
                    "node's writes (cut off from the others?), which may hand its starts on",
                    None,
                )
                return
            if lease.is_valid() == lapsed:
                lapsed = not lapsed
                if lapsed:
                    logger.warning("lease lapsed (starved or slow broker): observers paused until it is renewed")
                else:
                    logger.info("lease renewed: observers resume")
            await asyncio.sleep(max(0.0, period - (time.monotonic() - (lease.renewed_at or 0))))
    finally:
        # Cancelled with the session: the round trip still in flight fails with its
        # channel, and nobody needs its outcome (asyncio would log it as an ERROR with
        # a traceback, "Task exception was never retrieved", at every broker restart).
        if renewal is not None:
            renewal.add_done_callback(_outcome_unused)


def _outcome_unused(task: asyncio.Future[None]) -> None:
    """Mark a finished task's exception as seen."""
    if not task.cancelled():
        task.exception()
