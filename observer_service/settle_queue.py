"""The start deliveries' settles, on the holding loop (``holding.py``).

The main loop posts them through its mailbox (``Session.ack`` and the like) and never waits
for one: AMQP does not confirm a settle. One task sends them in the order posted, so an ack
of a stopped observer goes out before a close of its channel would turn it into a requeue
(``HoldingConnection.requeue_held`` sends what is queued first). Where a caller must know the
broker has taken its acks (a start moved off a queue: ``retire.py``), ``ack_taken`` follows
them with a round trip on each channel.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from typing import Literal

import aiormq.abc

from shared import topology

_ACK_TAKEN_WITHIN_S = 10.0  # the round trip after acks (``ack_taken``); a broker this slow is failing

# The channel a start delivery came on: settling it needs that channel and the delivery tag.
DeliveryChannel = aiormq.abc.AbstractChannel
Settle = Literal["ack", "requeue", "reject"]


class SettleQueue:
    def __init__(self, settled: Callable[[DeliveryChannel, int], None]) -> None:
        self._settled = settled  # a delivery's slot is free again (``StartConsumers.settled``)
        self._queued: collections.deque[tuple[Settle, DeliveryChannel, int]] = collections.deque()
        self._wakeup = asyncio.Event()  # binds to the holding loop on first use
        self._sending = asyncio.Lock()

    def post(self, operation: Settle, channel: DeliveryChannel, tag: int) -> None:
        """Queue a settle, to be sent by ``run`` (called on the holding loop)."""
        self._queued.append((operation, channel, tag))
        self._wakeup.set()

    async def run(self) -> None:
        """Send what is posted, as it comes, until cancelled (the session's close)."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await self.send()

    async def send(self) -> None:
        """Send every settle queued so far."""
        async with self._sending:
            while self._queued:
                operation, channel, tag = self._queued.popleft()
                # A closed channel's deliveries are the broker's again: nothing to settle.
                with contextlib.suppress(Exception):
                    if operation == "ack":
                        await channel.basic_ack(tag, wait=False)
                    elif operation == "requeue":
                        await channel.basic_nack(tag, requeue=True, wait=False)
                    else:
                        await channel.basic_reject(tag, requeue=False, wait=False)
                self._settled(channel, tag)

    async def ack_taken(self, deliveries: list[tuple[DeliveryChannel, int]]) -> bool:
        """Ack these deliveries, and say whether the broker has taken every ack: a settle has
        no answer, but a channel handles its frames in order, so a round trip on each channel
        after its acks (a passive declare) returns only once they were handled. False if a
        channel failed meanwhile: whether its acks were taken is unknown."""
        for channel, tag in deliveries:
            self.post("ack", channel, tag)
        await self.send()
        try:
            for channel in {id(channel): channel for channel, _ in deliveries}.values():
                async with asyncio.timeout(_ACK_TAKEN_WITHIN_S):
                    await channel.exchange_declare(exchange=topology.EVENTS_EXCHANGE, passive=True)
        except Exception:  # noqa: BLE001 - the channel or the connection is gone
            return False
        return True
