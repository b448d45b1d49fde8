"""The consumers of the pools' start queues on the holding connection, and where they stand.

Placement (docs/design.md, "Even load") is the broker's choice among them: each consumes
with the consumer priority (``x-priority``) the manager's balancer gave this service, and the
broker hands each start to the highest priority that has a free worker. A new priority, or
a cordon, means consuming again: cancelled and consumed anew on the same channels, a consumer
keeps every delivery it holds (``tests/system/test_consumer_priority.py``, every series), so
no running observer notices. Runs on the holding loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aio_pika.abc import AbstractChannel

from observer_service.start_channel import StartChannel
from shared import topology


@dataclass(frozen=True)
class Placement:
    """How this service takes new starts: its consumer priority, or none while cordoned."""

    priority: int = 0
    cordoned: bool = False


@dataclass
class _Consumer:
    channel: AbstractChannel  # aio-pika's, closed to hand every delivery back at once
    raw: StartChannel
    queue: str
    tag: str | None = None  # None while not consuming


class StartConsumers:
    def __init__(self, quorum: bool, placement: Placement) -> None:
        # A quorum queue times consumers out unless the consume says otherwise.
        self._arguments = dict(topology.HELD_FOR_GOOD) if quorum else {}
        self.placement = placement
        self._consumers: list[_Consumer] = []
        self._stopped = False  # the service is shutting down: never consume again
        self._changing = asyncio.Lock()  # one change at a time: two would consume twice

    async def hold(self, channel: AbstractChannel, raw: StartChannel, queue: str) -> None:
        """Consume ``queue`` on a channel of its own (its prefetch already set)."""
        consumer = _Consumer(channel, raw, queue)
        self._consumers.append(consumer)
        if self._consuming():
            await self._consume(consumer)

    async def place(self, placement: Placement) -> None:
        """Consume again under ``placement`` if it changed."""
        async with self._changing:
            if placement == self.placement:
                return
            self.placement = placement
            await self._cancel_all()
            if self._consuming():
                for consumer in self._consumers:
                    await self._consume(consumer)

    async def stop(self) -> None:
        """No new starts, for good (a graceful stop); the held deliveries stay held."""
        async with self._changing:
            self._stopped = True
            await self._cancel_all()

    async def close_channels(self, before_close: Callable[[AbstractChannel], None]) -> None:
        """Close every start channel: the broker requeues their unacked deliveries as one batch."""
        consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            before_close(consumer.channel)
        for consumer in consumers:
            with contextlib.suppress(Exception):
                await consumer.channel.close()

    def _consuming(self) -> bool:
        return not self._stopped and not self.placement.cordoned

    async def _consume(self, consumer: _Consumer) -> None:
        arguments = {**self._arguments, "x-priority": self.placement.priority}
        consumer.tag = await consumer.raw.consume(consumer.queue, arguments)

    async def _cancel_all(self) -> None:
        for consumer in self._consumers:
            tag, consumer.tag = consumer.tag, None
            if tag is not None:
                await _quietly(consumer.raw.basic_cancel(tag))


async def _quietly(call: Awaitable[object]) -> None:
    with contextlib.suppress(Exception):
        await call
