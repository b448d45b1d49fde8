"""Start deliveries waiting to be admitted, and the one task that admits them in order.

A reconnect or a failover hands a service thousands of starts at once. They are admitted in
chunks that yield to the event loop, so the AMQP heartbeats and the lease round trips keep
flowing (docs/design.md, "Pauses and the lease"); no faster than their reports are published
(``Outbox.has_room``: each start makes a report); and only under a valid lease: a start made
while the lease is lapsed would only park its observer on it. Meanwhile the deliveries stay
held, unstarted. A delivery whose session died is skipped: the broker requeued it.

A redelivered start waits until ``REDELIVERED_START_DELAY_S`` after it arrived: when the
broker closes a live service's connection (``rabbitmqctl close_connection``, a node's graceful
stop) it requeues that service's starts before it sends the close, so the other services get
them while the old holder's lease is still valid (docs/design.md, invariant 2).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from observer_service import metrics
from observer_service.gc_policy import GcPolicy
from observer_service.outbox import Outbox
from observer_service.session import Session
from observer_service.settle_queue import DeliveryChannel

# Starts admitted between yields to the event loop.
_YIELD_EVERY = 100
# How long after it arrived a redelivered start may begin: about ten times how late the old
# holder learnt of a close the broker sent (docs/design.md, invariant 2).
REDELIVERED_START_DELAY_S = 0.05


@dataclass(frozen=True, slots=True)
class Delivery:
    """A start delivery as the broker handed it: settled by its channel and tag."""

    body: bytes
    channel: DeliveryChannel
    tag: int
    redelivered: bool
    session: Session
    aside: bool = False  # came to a consumer stepped aside (``start_consumers.py``)
    headers: Mapping[str, Any] | None = None  # its AMQP headers: a trace's context (``shared/tracing.py``)
    received_at: float = 0.0  # ``time.monotonic`` when the holding thread received it

    def may_begin_at(self) -> float:
        """The monotonic instant this start may begin (module docstring)."""
        return self.received_at + REDELIVERED_START_DELAY_S if self.redelivered else 0.0


class Inbox:
    def __init__(
        self,
        outbox: Outbox,
        gc: GcPolicy,
        admit: Callable[[Delivery], Awaitable[None]],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.outbox = outbox
        self.gc = gc
        self.admit = admit
        self.spawn = spawn
        self.waiting: collections.deque[Delivery] = collections.deque()
        self.draining = False
        # False once shutting down: waiting starts are left unsettled (requeued on close).
        self.accepting = True

    def put(self, delivery: Delivery) -> None:
        self.waiting.append(delivery)
        if not self.draining:
            self.draining = True
            self.spawn(self._drain())

    async def _drain(self) -> None:
        waiting = self.waiting
        try:
            count = 0
            while waiting and self.accepting:
                if not self.outbox.has_room():
                    metrics.STARTS_HELD_BACK.inc()
                    await self.outbox.room()
                    continue
                if not may_act(waiting[0].session):
                    metrics.STARTS_AWAITING_LEASE.inc()
                    await until_lease(waiting[0].session)
                    continue
                with self.gc.burst():
                    while waiting and self.accepting and self.outbox.has_room():
                        head = waiting[0]
                        if not may_act(head.session):
                            break
                        if head.redelivered and (early := head.may_begin_at() - time.monotonic()) > 0:
                            # Within the burst: a failover's starts arrive while the first wait,
                            # and ending the burst at each would let the collector run between.
                            await asyncio.sleep(early)
                            continue
                        delivery = waiting.popleft()
                        if delivery.session.closed.is_set():
                            continue  # the broker has requeued it with the session
                        await self.admit(delivery)
                        self.gc.started()
                        count += 1
                        if count % _YIELD_EVERY == 0:
                            await asyncio.sleep(0)
                    self.gc.burst_done()
        finally:
            self.draining = False


def may_act(session: Session) -> bool:
    """Whether a start from ``session`` may begin now: its lease is valid, or the session is
    gone (its starts are skipped, not waited for)."""
    return session.lease.is_valid() or session.closed.is_set()


async def until_lease(session: Session) -> None:
    """Until ``session``'s lease is valid again or the session is gone.

    Starting while the lease is lapsed would only park each new observer on it: its first
    ``ensure_lease`` raises, and it waits for the renewal with a shielded future of its own,
    to start over when the lease is back. A failover on a saturated machine lapses the lease
    (the holding thread's round trips wait for the GIL and for a busy broker), and every
    delivery started meanwhile would pay that twice, plus the exception's cycle for the
    collector. So the whole backlog waits here, once, and starts when the lease is back
    (figures: docs/design.md, "Pauses and the lease")."""
    lease = session.lease
    while not may_act(session):
        if lease.renewed_at is None:
            # Revoked: this session is ending (``Session.fail`` sets ``closed`` next, on this loop).
            await session.closed.wait()
        else:
            await lease.changed()
