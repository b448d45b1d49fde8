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

A channel consuming nothing (its window was 0) consumes again at the first slot given back;
one that still consumes, once a twentieth of its size came back (``settled`` says why not
sooner).

Except on a quorum queue of RabbitMQ 4 or later: there each channel consumes under a tag of
its own every time, and the queue takes up the cancelled consumer's record again with what it
holds (``rabbit_fifo``'s ``merge_consumer``; the same test). The prefetch then counts everything
the channel holds, so it is that plus the window, and every settle gives its slot back to the
consumer by itself. A new tag would leave one more record at each consume for as long as the
one before holds deliveries, that is for days, and the queue walks all its records to find one
by tag at every consume, cancel and settle of a cancelled consumer's delivery.

Several start queues per pool (``ORCH_START_QUEUES``; docs/design.md, "A pool over several
start queues"): a quorum queue refuses a prefetch shared by a channel's consumers, so no
broker limit spans the queues. Each consumer is opened with at most the pool's free workers,
and so may be offered more than the pool has room for when several queues deliver at once:
what arrives past the pool's workers is excess, never run. The first excess cancels every
consumer of the pool (``pause``) before it is handed back, so it goes to a service with room,
and while any consumer is cut to the pool's free workers, a queue left with no consumer that
has room is offered them again as slots come back on any channel, and when a cut consumer uses
its window up (``_offer_every_queue``).

Stepping aside (docs/design.md, "Starts a service cannot run"): a service handed a start it
cannot run (a kind it lacks, no free process slot) consumes that pool's queues at ``ASIDE``,
below every placement, for a few seconds after its last such start, then under its placement
again. Meanwhile every start it hands back goes to any other service with a free worker
first, and it takes new starts only while every other one is full. Runs on the holding loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

from aio_pika.abc import AbstractChannel

from observer_service import metrics
from observer_service.start_channel import StartChannel
from shared import topology
from shared.messages import EVEN, UNDER

ASIDE = -1  # the priority of a queue stepped aside from: below every placement (0 to 2)

# What a delivery is to this service: a start to run; one that came to a consumer stepped
# aside (every other consumer was full or could not run it); one past the pool's workers.
Arrival = Literal["run", "aside", "excess"]


@dataclass(frozen=True)
class Placement:
    """How this service takes new starts: its consumer priority, or none while cordoned. Until
    the balancer says otherwise, the priority of a service at its fair share (``EVEN``): one
    that just joined takes its turn with the others at once, not after them. ``pools`` gives
    a pool a priority of its own, as (pool, priority) pairs."""

    priority: int = EVEN
    cordoned: bool = False
    pools: tuple[tuple[str, int], ...] = ()
    start_queues: int = 1  # each pool's start queues, all consumed

    def priority_in(self, pool: str) -> int:
        return dict(self.pools).get(pool, self.priority)

    def emptied(self) -> Placement:
        """This placement once the service runs nothing (its session ended and fenced it all):
        under its share in every pool, as the balancer will say once it hears; a cordon stays."""
        return self if self.cordoned else dataclasses.replace(self, priority=UNDER, pools=())


@dataclass
class _Consumer:
    channel: AbstractChannel  # aio-pika's, closed to hand every delivery back at once
    raw: StartChannel
    pool: str
    queue: str
    size: int  # the most this channel may hold
    index: int = 0  # which of the pool's start queues ``queue`` is
    tag: str | None = None  # None while not consuming
    unsettled: int = 0  # deliveries on this channel not acked, nacked or rejected yet
    last_tag: int = 0  # the highest delivery tag seen on the channel
    floor: int = 0  # ``last_tag`` when the current consumer began: older tags were not its own
    returned: int = 0  # slots given back since it began that its window did not get back
    aside: bool = False  # the current consumer consumes at ``ASIDE``
    window: int = 0  # the current consumer's prefetch
    current: int = 0  # deliveries to the current consumer not settled yet
    again: bool = False  # a consume again is on its way
    own_tag: str | None = None  # consumes under this tag each time, its record taken up

    def used_up(self) -> bool:
        return self.tag is None or self.current >= self.window


class StartConsumers:
    def __init__(self, quorum: bool, placement: Placement) -> None:
        # A quorum queue times consumers out unless the consume says otherwise.
        self._arguments = dict(topology.HELD_FOR_GOOD) if quorum else {}
        self._quorum = quorum
        self.placement = placement
        self._consumers: dict[int, _Consumer] = {}  # by id() of the raw channel
        self._pools: dict[str, list[_Consumer]] = {}
        self._workers: dict[str, int] = {}  # the most a pool's channels hold together
        self._held: dict[str, int] = {}  # deliveries of each pool not settled yet
        self._queues: dict[str, set[str]] = {}  # the start queues consumed of each pool
        self._cut: dict[str, set[int]] = {}  # each pool's consumers cut to its free workers
        self._stopped = False  # the service is shutting down: never consume again
        self._changing = asyncio.Lock()  # one change at a time: two would consume twice
        self._tasks: set[asyncio.Task[None]] = set()
        self._aside_until: dict[str, float] = {}  # pool -> when its step aside ends (monotonic)

    async def hold(
        self,
        channel: AbstractChannel,
        raw: StartChannel,
        pool: str,
        queue: str,
        size: int,
        workers: int,
        *,
        index: int = 0,
        takes_up_records: bool = False,
    ) -> None:
        """Consume ``queue``, a start queue of ``pool``, on a channel of its own holding at most
        ``size`` deliveries, and the pool's channels together at most ``workers``; under a tag
        of its own each time if the queue takes up a cancelled consumer's record (a quorum queue
        of RabbitMQ 4 on: ``start_channel.takes_up_records``)."""
        async with self._changing:
            consumer = _Consumer(channel, raw, pool, queue, size, index)
            if self._quorum and takes_up_records:
                consumer.own_tag = f"orch-start {queue}"
            self._consumers[id(raw)] = consumer
            self._pools.setdefault(pool, []).append(consumer)
            self._queues.setdefault(pool, set()).add(queue)
            self._workers[pool] = workers
            if self.consuming():
                await self._consume(consumer)

    def queues(self, pool: str) -> list[str]:
        """The start queues of ``pool`` consumed."""
        return sorted(self._queues.get(pool, ()))

    def held_by_index(self) -> list[int]:
        """The deliveries held from each start queue index, over every pool (any thread: the
        consumers are copied in one step)."""
        counts = [0]
        for consumer in list(self._consumers.values()):
            counts.extend([0] * (consumer.index + 1 - len(counts)))
            counts[consumer.index] += consumer.unsettled
        return counts

    async def release(self, pool: str, queue: str) -> list[AbstractChannel] | None:
        """Stop consuming ``queue`` of ``pool`` if its channels hold nothing, and forget them:
        the channels, for the caller to close. None: they hold deliveries (or one came before
        the cancels were answered), and the queue stays consumed."""
        async with self._changing:
            consumers = [c for c in self._pools.get(pool, []) if c.queue == queue]
            if not consumers or any(c.unsettled for c in consumers):
                return None
            for consumer in consumers:
                await self._cancel(consumer)
            if any(c.unsettled for c in consumers):
                for consumer in consumers:
                    if self.consuming():
                        await self._consume(consumer)
                return None
            for consumer in consumers:
                del self._consumers[id(consumer.raw)]
                self._pools[pool].remove(consumer)
                self._set_cut(consumer, False)
            self._queues[pool].discard(queue)
            return [c.channel for c in consumers]

    def index_of(self, raw: object) -> int | None:
        """Which of its pool's start queues the channel ``raw`` consumes (None: not a start
        channel of this session, or closed). Safe from any thread: one dict lookup."""
        consumer = self._consumers.get(id(raw))
        return None if consumer is None else consumer.index

    # --- called for each delivery and each settle, on the holding loop ----------------------

    def delivered(self, raw: object, tag: int) -> Arrival:
        """Count a delivery of ``raw`` and say what it is (``Arrival``). A start to a consumer
        stepped aside came because every other consumer was full (or none could run it)."""
        consumer = self._consumers.get(id(raw))
        if consumer is None:
            return "run"
        consumer.unsettled += 1
        consumer.last_tag = max(consumer.last_tag, tag)
        held = self._held[consumer.pool] = self._held.get(consumer.pool, 0) + 1
        # Frames arrive in order: a tag above the floor came to the current consumer.
        mine = tag > consumer.floor
        consumer.current += mine
        if mine and consumer.used_up() and self._cut.get(consumer.pool):
            # Its window may have been cut to fewer workers than are free now: freed by settles
            # on other queues, which offered them to none of its consumers while it had room.
            # No settle may come again (a killed service's starts just came back to it).
            self._offer_every_queue(consumer.pool)
        if held > self._workers[consumer.pool]:
            return "excess"
        return "aside" if consumer.aside and mine else "run"

    def settled(self, raw: object, tag: int) -> None:
        """A delivery of ``raw`` was acked, nacked or rejected: its slot is free again. A slot
        its current consumer does not get back by itself (an older consumer's delivery, or
        any while it consumes nothing) is counted, and the channel consumes again at the
        first such slot if it consumes nothing, else once a twentieth of its size came back.
        Not at every slot: each new consume leaves a record in a quorum queue for as long as
        the consumer before it holds deliveries, and observers run for days. Over several
        start queues, every queue is also kept offered the pool's free workers
        (``_offer_every_queue``)."""
        consumer = self._consumers.get(id(raw))
        if consumer is None:
            return
        consumer.unsettled -= 1
        self._held[consumer.pool] -= 1
        if tag > consumer.floor:
            consumer.current -= 1
        if tag <= consumer.floor or consumer.tag is None:
            consumer.returned += 1
            if consumer.returned >= (1 if consumer.tag is None else max(1, consumer.size // 20)):
                self._reopen(consumer)
        if self._cut.get(consumer.pool):
            self._offer_every_queue(consumer.pool)

    def _reopen(self, consumer: _Consumer) -> None:
        if not consumer.again and self.consuming():
            consumer.again = True  # at most one re-consume on its way: it takes every slot back
            self._spawn(self._again(consumer))

    def _offer_every_queue(self, pool: str) -> None:
        """A pool over several queues whose consumers were cut to its free workers: a queue
        none of whose consumers has room left while the pool has a free worker would keep its
        starts waiting; its roomiest channel consumes again (one per queue: one record each)."""
        if self._free(pool) <= 0:
            return
        by_queue: dict[str, list[_Consumer]] = {}
        for consumer in self._pools[pool]:
            by_queue.setdefault(consumer.queue, []).append(consumer)
        for consumers in by_queue.values():
            if all(c.used_up() and not c.again for c in consumers):
                self._reopen(max(consumers, key=lambda c: c.size - c.unsettled))

    async def pause(self, raw: object) -> None:
        """Cancel the consumers of the pool ``raw`` consumes while its workers are all taken:
        deliveries came past them (``Arrival`` "excess"), and what is handed back must not come
        straight back. Each consumes again at the next slot given back."""
        async with self._changing:
            paused = self._consumers.get(id(raw))
            if paused is None or self._free(paused.pool) > 0:
                return
            for consumer in self._pools[paused.pool]:
                self._set_cut(consumer, True)
                await self._cancel(consumer)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- placement ---------------------------------------------------------------------------

    async def place(self, placement: Placement) -> None:
        """Consume again under ``placement`` if it changed."""
        async with self._changing:
            # How many queues to consume is the holding connection's (``HoldingConnection.place``):
            # a change of it alone takes nothing from the consumers' priorities or cordon.
            same = dataclasses.replace(placement, start_queues=self.placement.start_queues) == self.placement
            self.placement = placement
            if not same:
                await self._consume_again()

    async def step_aside(self, pool: str, for_s: float) -> None:
        """Consume ``pool``'s queues at ``ASIDE`` until ``for_s`` from now (a later call extends
        it); returns once the consumers do, so a start handed back after it goes elsewhere first."""
        async with self._changing:
            already = pool in self._aside_until
            self._aside_until[pool] = time.monotonic() + for_s
            if not already:
                await self._consume_again(pool)
                self._spawn(self._step_back(pool))

    async def _step_back(self, pool: str) -> None:
        while True:
            await asyncio.sleep(max(0.0, self._aside_until[pool] - time.monotonic()))
            async with self._changing:
                if time.monotonic() >= self._aside_until[pool]:
                    del self._aside_until[pool]
                    await self._consume_again(pool)
                    return

    async def _consume_again(self, pool: str | None = None) -> None:
        """Cancel the consumers of ``pool`` (of every pool: None) and consume anew."""
        for consumer in self._consumers.values():
            if pool in (None, consumer.pool):
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
        self._pools.clear()
        self._held.clear()
        self._queues.clear()
        self._cut.clear()
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

    def _set_cut(self, consumer: _Consumer, cut: bool) -> None:
        cut_ones = self._cut.setdefault(consumer.pool, set())
        if cut:
            cut_ones.add(id(consumer.raw))
        else:
            cut_ones.discard(id(consumer.raw))

    async def _again(self, consumer: _Consumer) -> None:
        async with self._changing:
            consumer.again = False
            if self.consuming() and id(consumer.raw) in self._consumers:
                await self._cancel(consumer)
                await self._consume(consumer)

    async def _consume(self, consumer: _Consumer) -> None:
        """Consume with the window the channel has left, at most the pool's free workers (none:
        it waits for a settle). Deliveries sent before a cancel's reply were counted already:
        frames arrive in order. A record taken up (``own_tag``) holds them all: its prefetch
        counts them, and each one settled is a slot of the current consumer."""
        window = min(consumer.size - consumer.unsettled, self._free(consumer.pool))
        self._set_cut(consumer, window < consumer.size - consumer.unsettled)
        if consumer.own_tag is None:
            consumer.floor, consumer.current, consumer.window = consumer.last_tag, 0, window
        else:
            consumer.floor, consumer.current = 0, consumer.unsettled
            consumer.window = consumer.unsettled + window
        consumer.returned = 0
        consumer.aside = consumer.pool in self._aside_until
        if window <= 0:
            return  # not consuming: the next slot given back consumes again
        await consumer.channel.set_qos(prefetch_count=consumer.window)
        priority = ASIDE if consumer.aside else self.placement.priority_in(consumer.pool)
        arguments = {**self._arguments, "x-priority": priority}
        consumer.tag = await consumer.raw.consume(consumer.queue, arguments, consumer.own_tag)
        metrics.START_CONSUMES.inc()

    def _free(self, pool: str) -> int:
        return self._workers[pool] - self._held.get(pool, 0)

    async def _cancel(self, consumer: _Consumer) -> None:
        tag, consumer.tag = consumer.tag, None
        if tag is not None:
            await _quietly(consumer.raw.basic_cancel(tag))


async def _quietly(call: Awaitable[object]) -> None:
    with contextlib.suppress(Exception):
        await call
