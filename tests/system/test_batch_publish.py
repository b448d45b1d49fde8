"""``shared.batch_publish`` against a real broker: it writes frames itself and registers its
confirmations in aiormq's channel tables, so these tests are what an aiormq upgrade that
changes those tables would fail."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import cast

import aio_pika
import aiormq
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq import spec
from aiormq.abc import DeliveredMessage

from shared.batch_publish import BatchMessage, publish_batch
from tools import infra


@pytest.fixture
async def connection(rabbit: infra.RabbitNode, vhost: str) -> AsyncIterator[AbstractConnection]:
    conn = await aio_pika.connect(rabbit.url_for(vhost))
    yield conn
    await conn.close()


async def _confirming(connection: AbstractConnection) -> tuple[AbstractChannel, aiormq.Channel]:
    channel = await connection.channel(publisher_confirms=True)
    return channel, cast(aiormq.Channel, await channel.get_underlay_channel())


def _message(queue: str, body: bytes) -> BatchMessage:
    return BatchMessage(queue, body, spec.Basic.Properties(delivery_mode=2, message_id=uuid.uuid4().hex))


async def _drain(channel: AbstractChannel, queue: str, count: int) -> list[aio_pika.abc.AbstractIncomingMessage]:
    q = await channel.get_queue(queue)
    got = []
    for _ in range(count):
        message = await q.get(no_ack=True, timeout=10)
        assert message is not None
        got.append(message)
    assert await q.get(no_ack=True, fail=False) is None
    return got


async def test_every_message_is_confirmed_and_arrives_in_order_on_its_queue(connection: AbstractConnection) -> None:
    channel, raw = await _confirming(connection)
    for name in ("bp-a", "bp-b"):
        await channel.declare_queue(name, durable=True)
    big = bytes(range(256)) * 1200  # 300 KiB: more than one body frame (frame_max 128 KiB)
    messages = [_message("bp-a" if i % 3 else "bp-b", f"m{i}".encode()) for i in range(2_500)]
    messages.insert(1_000, _message("bp-a", big))

    results = await publish_batch(raw, messages, timeout=30, mandatory=True)

    assert len(results) == len(messages)
    assert all(isinstance(r, spec.Basic.Ack) for r in results)
    assert raw.message_id_delivery_tag == {}, "the batch's message ids are forgotten once settled"
    for name in ("bp-a", "bp-b"):
        sent = [m for m in messages if m.routing_key == name]
        got = await _drain(channel, name, len(sent))
        assert [g.body for g in got] == [m.body for m in sent]
        assert [g.message_id for g in got] == [m.properties.message_id for m in sent]
        assert all(g.delivery_mode == aio_pika.DeliveryMode.PERSISTENT for g in got)


async def test_batches_interleave_with_aiormq_publishes_on_one_channel(connection: AbstractConnection) -> None:
    """Delivery tags are shared with aiormq's own publishes; a wrong count would leave a
    confirm unmatched and a publish waiting forever."""
    channel, raw = await _confirming(connection)
    await channel.declare_queue("bp-mixed", durable=True)

    async def single(i: int) -> object:
        return await raw.basic_publish(f"s{i}".encode(), routing_key="bp-mixed")

    async def batch(i: int) -> list[object]:
        return list(
            await publish_batch(raw, [_message("bp-mixed", f"b{i}-{j}".encode()) for j in range(50)], timeout=30)
        )

    outcomes = await asyncio.gather(*(single(i) if i % 2 else batch(i) for i in range(40)))

    singles = [o for o in outcomes if not isinstance(o, list)]
    batched = [r for o in outcomes if isinstance(o, list) for r in o]
    assert len(singles) == 20 and len(batched) == 20 * 50
    assert all(isinstance(r, spec.Basic.Ack) for r in [*singles, *batched])
    assert len(await _drain(channel, "bp-mixed", 20 + 20 * 50)) == 1_020


async def test_an_unroutable_mandatory_message_comes_back_and_the_rest_are_acked(
    connection: AbstractConnection,
) -> None:
    channel, raw = await _confirming(connection)
    await channel.declare_queue("bp-here", durable=True)
    messages = [_message("bp-here", b"1"), _message("bp-nowhere", b"2"), _message("bp-here", b"3")]

    results = await publish_batch(raw, messages, timeout=30, mandatory=True)

    assert isinstance(results[0], spec.Basic.Ack) and isinstance(results[2], spec.Basic.Ack)
    assert isinstance(results[1], DeliveredMessage)
    assert results[1].body == b"2"
    assert [m.body for m in await _drain(channel, "bp-here", 2)] == [b"1", b"3"]
    # The channel goes on: a later batch is confirmed as usual.
    assert isinstance((await publish_batch(raw, [_message("bp-here", b"4")], timeout=30))[0], spec.Basic.Ack)


async def test_a_channel_that_closes_fails_the_batch_instead_of_leaving_it_waiting(
    connection: AbstractConnection,
) -> None:
    channel, raw = await _confirming(connection)
    # Publishing to an exchange that does not exist makes the broker close the channel (404).
    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
        await publish_batch(
            raw, [_message("any", b"x") for _ in range(100)], exchange="bp-no-such-exchange", timeout=30
        )
    # Closed now: refused at once.
    with pytest.raises(aiormq.exceptions.ChannelInvalidStateError):
        await publish_batch(raw, [_message("any", b"x")], timeout=30)
    assert channel.is_closed


async def test_a_batch_without_message_ids_is_refused_before_anything_is_sent(connection: AbstractConnection) -> None:
    channel, raw = await _confirming(connection)
    await channel.declare_queue("bp-ids", durable=True)
    tag = raw.delivery_tag
    bad = [_message("bp-ids", b"ok"), BatchMessage("bp-ids", b"no id", spec.Basic.Properties(delivery_mode=2))]
    with pytest.raises(ValueError, match="message_id"):
        await publish_batch(raw, bad, timeout=30)
    assert raw.delivery_tag == tag and not raw.confirmations
    assert isinstance((await publish_batch(raw, [_message("bp-ids", b"after")], timeout=30))[0], spec.Basic.Ack)
    assert [m.body for m in await _drain(channel, "bp-ids", 1)] == [b"after"]
