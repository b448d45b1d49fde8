"""``observer_service.start_channel`` against a real broker: it replaces how aiormq hands a
channel's deliveries to its consumer, so these tests are what an aiormq upgrade that changes
that path would fail."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractConnection
from aiormq.abc import DeliveredMessage

from observer_service.start_channel import StartChannel, as_start_channel
from tools import infra


@pytest.fixture
async def connection(rabbit: infra.RabbitNode, vhost: str) -> AsyncIterator[AbstractConnection]:
    conn = await aio_pika.connect(rabbit.url_for(vhost))
    yield conn
    await conn.close()


async def _holder(
    connection: AbstractConnection, queue: str, handler: object, prefetch: int = 100
) -> tuple[aio_pika.abc.AbstractChannel, StartChannel]:
    channel = await connection.channel(publisher_confirms=False)
    await channel.declare_queue(queue, durable=True)
    raw = as_start_channel(await channel.get_underlay_channel(), handler)  # type: ignore[arg-type]
    await channel.set_qos(prefetch_count=prefetch)
    return channel, raw


async def _publish(connection: AbstractConnection, queue: str, bodies: list[bytes]) -> None:
    channel = await connection.channel()
    for body in bodies:
        await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue)
    await channel.close()


class Collector:
    """A delivery handler that keeps what it is given; ``wait_for(n)`` until it has n."""

    def __init__(self) -> None:
        self.got: list[DeliveredMessage] = []
        self.tasks: list[asyncio.Task[object] | None] = []  # kept: ids are never reused
        self._changed = asyncio.Event()

    def __call__(self, message: DeliveredMessage) -> None:
        if message.body == b"bad":
            raise RuntimeError("handler bug")
        self.got.append(message)
        self.tasks.append(asyncio.current_task())
        self._changed.set()

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(10):
            while len(self.got) < count:
                self._changed.clear()
                await self._changed.wait()


async def test_every_delivery_reaches_the_handler_in_order_without_a_task_each(
    connection: AbstractConnection,
) -> None:
    queue = f"hc-{uuid.uuid4().hex[:8]}"
    handler = Collector()
    got = handler.got
    channel, raw = await _holder(connection, queue, handler)
    big = bytes(range(256)) * 1200  # 300 KiB: more than one body frame (frame_max 128 KiB)
    bodies = [f"m{i}".encode() for i in range(50)]
    bodies.insert(20, big)
    await _publish(connection, queue, bodies)
    await raw.consume(queue, {})
    await handler.wait_for(len(bodies))

    assert [m.body for m in got] == bodies
    # Called on the channel's reader task, not on a task made for each delivery.
    assert len({id(t) for t in handler.tasks}) == 1
    tags = [m.delivery.delivery_tag for m in got]  # type: ignore[union-attr]
    assert tags == list(range(1, len(bodies) + 1))
    assert all(m.channel is raw for m in got)
    # Settling by tag on the raw channel works as for any consumer: nothing is left.
    for tag in tags:
        await raw.basic_ack(tag)
    await channel.close()
    check = await connection.channel()
    assert (await check.declare_queue(queue, durable=True, passive=True)).declaration_result.message_count == 0


async def test_a_failing_handler_is_logged_and_the_channel_goes_on(
    connection: AbstractConnection, caplog: pytest.LogCaptureFixture
) -> None:
    queue = f"hc-{uuid.uuid4().hex[:8]}"
    handler = Collector()
    channel, raw = await _holder(connection, queue, handler)
    await _publish(connection, queue, [b"a", b"bad", b"b"])
    await raw.consume(queue, {})
    await handler.wait_for(2)

    assert [m.body for m in handler.got] == [b"a", b"b"]

    assert not raw.is_closed
    assert "the delivery handler of channel" in caplog.text
    await channel.close()


async def test_a_closed_holder_gives_its_unsettled_deliveries_back(connection: AbstractConnection) -> None:
    queue = f"hc-{uuid.uuid4().hex[:8]}"
    first = Collector()
    channel, raw = await _holder(connection, queue, first, prefetch=3)
    await _publish(connection, queue, [b"1", b"2", b"3", b"4", b"5"])
    await raw.consume(queue, {})
    await first.wait_for(3)
    await asyncio.sleep(0.3)
    assert len(first.got) == 3  # the prefetch holds: the broker sends no more until one is settled
    await channel.close()

    again = Collector()
    _, other = await _holder(connection, queue, again)
    await other.consume(queue, {})
    await again.wait_for(5)
    assert sorted(m.body for m in again.got) == [b"1", b"2", b"3", b"4", b"5"]
    assert sum(bool(m.delivery.redelivered) for m in again.got) == 3  # type: ignore[union-attr]


def test_only_a_plain_aiormq_channel_is_converted() -> None:
    with pytest.raises(TypeError, match=r"expected an aiormq\.Channel"):
        as_start_channel(object(), lambda message: None)  # type: ignore[arg-type]
