"""Start deliveries handed to a plain function, without a task per delivery.

aiormq calls a consumer by creating a task for ``consumer(message)`` (a plain function is
wrapped into a coroutine first), registers it in two future stores and gives it a done
callback. The holding connection's consumer does nothing but post the delivery to the main
loop, and in a failover a service takes thousands of deliveries a second on that one
thread, sharing the GIL with the loop that starts their observers, so a task per delivery
is CPU that both loops miss (figures: docs/design.md, "Where the time goes").

``as_start_channel`` turns an open aiormq channel into a ``StartChannel``, whose deliveries
go to ``on_delivery`` synchronously, in the order they arrive, on the channel's reader. It
relies on aiormq's ``Channel._on_deliver_frame``, ``_get_frame`` and ``_read_content``:
``pyproject.toml`` pins aiormq to the minor version they were read from, and
``tests/system/test_start_channel.py`` checks deliveries, a body of several frames and a failing
callback against a real broker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.common import FieldTable
from pamqp.header import ContentHeader

logger = logging.getLogger(__name__)

DeliveryHandler = Callable[[DeliveredMessage], None]


class StartChannel(aiormq.Channel):
    """An aiormq channel whose deliveries go to ``on_delivery``, a plain function, called on
    the channel's reader: it must not block, and what it raises is logged, not fatal."""

    on_delivery: DeliveryHandler | None = None

    async def _on_deliver_frame(self, frame: spec.Basic.Deliver) -> None:
        header = await self._get_frame()
        if not isinstance(header, ContentHeader):
            raise ValueError(f"Unexpected frame {header!r} instead of ContentHeader", header)
        self._deliver(await self._read_content(frame, header))

    async def consume(self, queue: str, arguments: FieldTable, tag: str | None = None) -> str:
        """``basic.consume`` on ``queue`` (under ``tag``, or a new one); the consumer tag. aiormq
        registers ``_deliver_in_task`` as its consumer, which only its own ``_on_deliver_frame``
        would call: a delivery still reaches the handler if a later aiormq no longer calls ours."""
        ok = await self.basic_consume(queue, self._deliver_in_task, arguments=arguments, consumer_tag=tag)
        assert ok.consumer_tag is not None
        return ok.consumer_tag

    async def _deliver_in_task(self, message: DeliveredMessage) -> None:
        self._deliver(message)

    def _deliver(self, message: DeliveredMessage) -> None:
        if self.on_delivery is None:
            logger.warning("a delivery on channel %s with no handler: left unsettled", self.number)
            return
        try:
            self.on_delivery(message)
        except Exception:
            logger.exception("the delivery handler of channel %s failed", self.number)


def takes_up_records(channel: aiormq.abc.AbstractChannel) -> bool:
    """Whether a quorum queue's consumer consumed again under its own tag takes up its record
    (RabbitMQ 4 on; ``tests/system/test_consumer_priority.py``): 3.10's channel crashes at the
    first delivery to it."""
    version = channel.connection.server_properties.get("version", "")
    version = version.decode() if isinstance(version, bytes) else str(version)
    major = version.split(".", 1)[0]
    return major.isdigit() and int(major) >= 4


def as_start_channel(channel: aiormq.abc.AbstractChannel, on_delivery: DeliveryHandler) -> StartChannel:
    """Make ``channel`` (an open ``aiormq.Channel``, before it consumes) a ``StartChannel``.
    The class is swapped in place: aiormq's connection creates its channels itself, and the
    subclass adds no state of its own but the handler."""
    if type(channel) is not aiormq.Channel:
        raise TypeError(f"expected an aiormq.Channel, got {type(channel).__name__}")
    channel.__class__ = StartChannel
    assert isinstance(channel, StartChannel)
    channel.on_delivery = on_delivery
    return channel
