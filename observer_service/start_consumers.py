"""The consumers of the pools' start queues on the holding connection, and where they stand.

Placement (docs/design.md, "Even load") is the broker's choice among them: each consumes
with the consumer priority (``x-priority``) the manager's balancer gave this service, and the
broker hands each start to the highest priority that has a free worker. A new priority, or
a cordon, means consuming again: cancelled and consumed anew on the same channels, a consumer
keeps every delivery it held (``tests/system/test_consumer_priority.py``, every series), so
no running observer notices.

The capacity is the subtle part. A prefetch limit counts the deliveries of one consumer: the
new consumer of a channel gets a whole new window, and what the cancelled one still holds
counts for nothing (the same test), so a service of one worker that consumed again ran two.
So each consumer is opened with the window its channel has left (its size less what the
channel holds unsettled), and a channel consumes again once enough of what it held before
has been settled, to give those slots back.

Stepping aside (docs/design.md, "Starts a service cannot run"): a service handed a start it
cannot run (a kind it lacks, no free process slot) consumes that queue at ``ASIDE``, below
every placement, for a few seconds after its last such start, then under its placement again.
Meanwhile every start it hands back goes to any other service with a free worker first, and
it takes new starts only while every other one is full. Runs on the holding loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from aio_pika.abc import AbstractChannel

from observer_service.start_channel import StartChannel
from shared import topology

ASIDE = -1  # the priority of a queue stepped aside from: below every placement (0 to 2)


@dataclass(frozen=True)
class Placement:
    """How this service takes new starts: its consumer priority, or none while cordoned. Until
    the balancer says otherwise, the priority of a service at its fair share (``EVEN``): one
    that just joined takes its turn with the others at once, not after them. ``pools`` gives
    a pool a priority of its own, as (pool, priority) pairs."""

    priority: int = 1  # manager.balance.plan.EVEN
    cordoned: bool = False
    pools: tuple[tuple[str, int], ...] = ()

    def priority_in(self, pool: str) -> int:
        return dict(self.pools).get(pool, self.priority)


@dataclass
class _Consumer:
    channel: AbstractChannel  # aio-pika's, closed to hand every delivery back at once
    raw: StartChannel
    pool: str
    queue: str
    size: int  # the most this channel may hold
    tag: str | None = None  # None while not consuming
    unsettled: int = 0  # deliveries on this channel not acked, nacked or rejected yet
    last_tag: int = 0  # the highest delivery tag seen on the channel
    floor: int = 0  # ``last_tag`` when the current consumer began: older tags were not its own
    returned: int = 0  # older deliveries settled since: slots the current window did not get back
    aside: bool = False  # the current consumer consumes at ``ASIDE``


class StartConsumers:
    def __init__(self, quorum: bool, placement: Placement) -> None:
        # A quorum queue times consumers out unless the consume says otherwise.
        self._arguments = dict(topology.HELD_FOR_GOOD) if quorum else {}
        self.placement = placement
        self._consumers: dict[int, _Consumer] = {}  # by id() of the raw channel
        self._stopped = False  # the service is shutting down: never consume again
        self._changing = asyncio.Lock()  # one change at a time: two would consume twice
        self._tasks: set[asyncio.Task[None]] = set()
        self._aside_until: dict[str, float] = {}  # queue -> when its step aside ends (monotonic)

    async def hold(self, channel: AbstractChannel, raw: StartChannel, pool: str, size: int) -> None:
        """Consume ``pool``'s start queue on a channel of its own, holding at most ``size`` deliveries."""
        consumer = _Consumer(channel, raw, pool, topology.start_queue_name(pool), size)
        self._consumers[id(raw)] = consumer
        if self.consuming():
            await self._consume(consumer)

    # --- called for each delivery and each settle, on the holding loop ----------------------

    def delivered(self, raw: object, tag: int) -> bool:
        """Count a delivery of ``raw``; True if it came to a consumer stepped aside, which the
        broker serves only while every other consumer is full (or none can run it)."""
        consumer = self._consumers.get(id(raw))
        if consumer is None:
            return False
        consumer.unsettled += 1
        consumer.last_tag = max(consumer.last_tag, tag)
        # Frames arrive in order: a tag above the floor came to the current consumer.
        return consumer.aside and tag > consumer.floor

    def settled(self, raw: object, tag: int) -> None:
        """A delivery of ``raw`` was acked, nacked or rejected; if the slots given back to a
        channel's current window are too few, it consumes again with a wider one."""
        consumer = self._consumers.get(id(raw))
        if consumer is None:
            return
        consumer.unsettled -= 1
        if tag <= consumer.floor:
            consumer.returned += 1
        if self.consuming() and consumer.returned >= max(1, consumer.size // 20):
            consumer.returned = 0  # at most one re-consume on its way per batch of slots
            self._spawn(self._again(consumer))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- placement ---------------------------------------------------------------------------

    async def place(self, placement: Placement) -> None:
        """Consume again under ``placement`` if it changed."""
        async with self._changing:
            if placement == self.placement:
                return
            self.placement = placement
            await self._consume_again()

    async def step_aside(self, queue: str, for_s: float) -> None:
        """Consume ``queue`` at ``ASIDE`` until ``for_s`` from now (a later call extends it);
        returns once the consumers do, so a start handed back after it goes elsewhere first."""
        async with self._changing:
            already = queue in self._aside_until
            self._aside_until[queue] = time.monotonic() + for_s
            if not already:
                await self._consume_again(queue)
                self._spawn(self._step_back(queue))

    async def _step_back(self, queue: str) -> None:
        while True:
            await asyncio.sleep(max(0.0, self._aside_until[queue] - time.monotonic()))
            async with self._changing:
                if time.monotonic() >= self._aside_until[queue]:
                    del self._aside_until[queue]
                    await self._consume_again(queue)
                    return

    async def _consume_again(self, queue: str | None = None) -> None:
        """Cancel the consumers of ``queue`` (of every queue: None) and consume anew."""
        for consumer in self._consumers.values():
            if queue in (None, consumer.queue):
                await self._cancel(consumer)
                if self.consuming():
                    await self._consume(consumer)

    async def stop(self) -> None:
        """No new starts, for good (a graceful stop); the held deliveries stay held."""
        async with self._changing:
            self._stopped = True
            for consumer in self._consumers.values():
                await self._cancel(consumer)

    async def close_channels(self, before_close: Callable[[AbstractChannel], None]) -> None:
        """Close every start channel: the broker requeues their unacked deliveries as one batch."""
        consumers = list(self._consumers.values())
        self._consumers.clear()
        for task in list(self._tasks):
            task.cancel()
        for consumer in consumers:
            before_close(consumer.channel)
        for consumer in consumers:
            with contextlib.suppress(Exception):
                await consumer.channel.close()

    def consuming(self) -> bool:
        """Whether the start queues are consumed (not cordoned, not shutting down)."""
        return not self._stopped and not self.placement.cordoned

    async def _again(self, consumer: _Consumer) -> None:
        async with self._changing:
            if self.consuming() and id(consumer.raw) in self._consumers:
                await self._cancel(consumer)
                await self._consume(consumer)

    async def _consume(self, consumer: _Consumer) -> None:
        """Consume with the window the channel has left (none: it waits for a settle).
        Deliveries sent before a cancel's reply were counted already: frames arrive in order."""
        consumer.floor, consumer.returned = consumer.last_tag, 0
        consumer.aside = consumer.queue in self._aside_until
        window = consumer.size - consumer.unsettled
        if window <= 0:
            consumer.returned = max(1, consumer.size // 20) - 1  # the next settle consumes again
            return
        await consumer.channel.set_qos(prefetch_count=window)
        priority = ASIDE if consumer.aside else self.placement.priority_in(consumer.pool)
        arguments = {**self._arguments, "x-priority": priority}
        consumer.tag = await consumer.raw.consume(consumer.queue, arguments)

    async def _cancel(self, consumer: _Consumer) -> None:
        tag, consumer.tag = consumer.tag, None
        if tag is not None:
            await _quietly(consumer.raw.basic_cancel(tag))


async def _quietly(call: Awaitable[object]) -> None:
    with contextlib.suppress(Exception):
        await call
