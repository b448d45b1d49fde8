"""Observers' events, published in batches on the session's publish channel.

An emit joins a queue; one task publishes whatever is queued (``shared.batch_publish``: one
lock, one buffer, one write), so while a batch waits for its confirms the next one gathers,
and a busier service sends larger batches. One aio-pika publish per emit cost too much CPU
per event (figures: docs/design.md, "Pauses and the lease").

What an emit promises:
* it returns once the broker confirmed *its* message (every message keeps its own
  delivery tag and confirmation);
* it raises ``LeaseLost`` if its message was not published because the lease had lapsed,
  and if the publish failed, which ends the session (``on_failure``): the channel is gone
  or going, and the observer must stop acting;
* no deadline: a broker that throttles or blocks the publish connection delays emits (the
  session's ``emits_in_flight`` slots fill, and observers wait for one), it does not fail
  them. Slowness is not death (issue 17).

A broker's ``basic.nack`` (an internal error) fails that emit with ``DeliveryError``, as
aio-pika's publish does; the session ends on any failed emit.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import uuid
from collections.abc import Callable

import aiormq
from aiormq.exceptions import DeliveryError
from pamqp import commands as spec

from observer_service.lease import Lease
from shared import topology
from shared.batch_publish import BatchMessage, publish_batch
from shared.errors import LeaseLost

MAX_BATCH = 1000  # messages per write; the rest wait for the next batch


class Slots:
    """At most ``size`` holders at once; the others wait, first come first served. Each
    acquire and release costs O(1) however many wait.

    Not ``asyncio.Semaphore``: in Python 3.11 each woken waiter removes its future from the
    waiters' deque by value, and ``locked()`` scans every waiter; both are O(waiters), and in
    a failover hundreds of thousands wait on one survivor (figures: docs/design.md, "Pauses
    and the lease"). Here a cancelled waiter's future stays in the
    deque and is skipped when its turn comes."""

    def __init__(self, size: int) -> None:
        self._free = size
        # Invariant: a free slot means nobody waits (``release`` hands a slot to the first
        # live waiter before it frees one).
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def full(self) -> bool:
        return self._free == 0

    async def acquire(self) -> None:
        if self._free > 0:
            self._free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.release()  # handed a slot as it was cancelled: pass it on
            raise

    def release(self) -> None:
        while self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(None)  # the slot goes straight to this waiter
                return
        self._free += 1


class EventPublisher:
    """Publishes emits in batches until closed; one per session."""

    def __init__(self, channel: aiormq.abc.AbstractChannel, lease: Lease, on_failure: Callable[[str], None]) -> None:
        self.channel = channel
        self.lease = lease
        self.on_failure = on_failure
        self._queued: list[tuple[BatchMessage, asyncio.Future[None]]] = []
        self._in_flight: list[tuple[BatchMessage, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._closed: str | None = None
        self._task = asyncio.create_task(self._publish_queued(), name="emits")

    async def publish(self, routing_key: str, body: bytes) -> None:
        """Publish one event to the events exchange and wait for its confirm."""
        if self._closed is not None:
            raise LeaseLost(f"cannot emit: {self._closed}")
        properties = topology.persistent_properties(uuid.uuid4().hex)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append((BatchMessage(routing_key, body, properties), done))
        self._wake.set()
        await done

    async def close(self, reason: str) -> None:
        """Fail what is queued with ``LeaseLost`` and stop publishing."""
        self._closed = reason
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task
        self._fail(self._in_flight + self._queued, LeaseLost(f"cannot emit: {reason}"))
        self._in_flight, self._queued = [], []

    async def _publish_queued(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queued:
                batch, self._queued = self._queued[:MAX_BATCH], self._queued[MAX_BATCH:]
                self._in_flight = batch
                try:
                    self.lease.ensure()  # it may have lapsed while these waited
                except LeaseLost as e:
                    self._fail(batch, e)
                    continue
                try:
                    results = await publish_batch(
                        self.channel,  # type: ignore[arg-type]  # aio-pika gives its aiormq.Channel
                        [message for message, _ in batch],
                        timeout=None,
                        exchange=topology.EVENTS_EXCHANGE,
                    )
                except Exception as e:  # noqa: BLE001 - the channel is gone or going
                    self._closed = f"event publish failed: {e!r}"
                    self.on_failure(self._closed)
                    self._fail(batch + self._queued, LeaseLost(f"cannot emit: {e!r}"))
                    self._queued = []
                    return
                for (_, done), result in zip(batch, results, strict=True):
                    if done.done():
                        continue  # its emitter was cancelled
                    if isinstance(result, spec.Basic.Ack):
                        done.set_result(None)
                    else:
                        done.set_exception(DeliveryError(None, result))  # type: ignore[arg-type]

    @staticmethod
    def _fail(batch: list[tuple[BatchMessage, asyncio.Future[None]]], error: Exception) -> None:
        for _, done in batch:
            if not done.done():
                done.set_exception(error)
