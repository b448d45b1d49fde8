"""Many confirmed publishes on one aiormq channel, written to the socket as one frame buffer.

aiormq's ``Channel.basic_publish`` is built for one message at a time: per message it takes
the channel lock, enters two context managers and a timeout, builds and marshals three
pamqp frames into their own buffer and queues one write. A bulk create publishes a
thousand starts per request, and that machinery dominated the API process's CPU (figures:
docs/benchmarks.md, "What the figures say"). Here the lock is taken once per batch,
the frames of every message are marshalled into one buffer (the ``basic.publish`` frame
once per routing key) and queued as one write.

Each message still gets its own delivery tag and its own confirmation future in the
channel's tables, so aiormq's reader settles them exactly as it settles its own publishes:
``basic.ack`` resolves the future, ``basic.nack`` fails it with ``DeliveryError``, a
``basic.return`` of a mandatory message resolves it with the returned message, and a
channel that closes fails every pending one (the futures live in the channel's future
store). This relies on aiormq's ``Channel`` attributes ``lock``, ``delivery_tag``,
``confirmations``, ``message_id_delivery_tag``, ``max_content_size`` and ``write_queue``:
``pyproject.toml`` pins aiormq to the minor version they were read from, and
``tests/system/test_batch_publish.py`` checks acks, returns and a closed channel against a real
broker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import aiormq
import pamqp.frame
from aiormq.abc import ChannelFrame, ConfirmationFrameType, DeliveredMessage
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader


@dataclass(frozen=True, slots=True)
class BatchMessage:
    routing_key: str
    body: bytes
    # ``message_id`` must be set: a returned message is matched to its publish by it.
    properties: spec.Basic.Properties


async def publish_batch(
    channel: aiormq.Channel,
    messages: Sequence[BatchMessage],
    *,
    timeout: float | None,
    exchange: str = "",
    mandatory: bool = False,
) -> list[ConfirmationFrameType | DeliveredMessage]:
    """Publish every message, in order, and wait up to ``timeout`` seconds (None: as long as
    it takes) for the broker's answer to each: ``basic.ack``, or the returned message for an unroutable mandatory one
    (on a channel opened with ``on_return_raises=False``, as aio-pika opens them).

    Raises ``TimeoutError``; ``DeliveryError`` for a ``basic.nack``; the channel's close
    reason if it closes meanwhile. Whatever is raised, some messages may have reached
    their queues. The channel must be in confirm mode."""
    if not channel.publisher_confirms:
        raise ValueError("publish_batch needs a channel in publisher-confirm mode")
    if not messages:
        return []
    number = channel.number
    chunk = channel.max_content_size
    publish_frames: dict[str, bytes] = {}
    payload = bytearray()
    for message in messages:
        if not message.properties.message_id:
            raise ValueError("every message of a batch needs a message_id")
        publish = publish_frames.get(message.routing_key)
        if publish is None:
            frame = spec.Basic.Publish(exchange=exchange, routing_key=message.routing_key, mandatory=mandatory)
            publish = publish_frames[message.routing_key] = pamqp.frame.marshal(frame, number)
        payload += publish
        body = message.body
        payload += pamqp.frame.marshal(ContentHeader(0, len(body), message.properties), number)
        for offset in range(0, len(body), chunk):
            payload += pamqp.frame.marshal(ContentBody(body[offset : offset + chunk]), number)

    confirmations: list[asyncio.Future[ConfirmationFrameType | DeliveredMessage]] = []
    async with asyncio.timeout(timeout):  # also over the lock and a full write queue
        async with channel.lock:  # raises ChannelInvalidStateError on a closed channel
            first_tag = channel.delivery_tag + 1
            for tag, message in enumerate(messages, start=first_tag):
                # From the channel's future store: a channel that closes fails them all.
                confirmation = channel.create_future()
                channel.confirmations[tag] = confirmation
                channel.message_id_delivery_tag[message.properties.message_id] = tag  # type: ignore[index]
                confirmations.append(confirmation)
            channel.delivery_tag = first_tag + len(messages) - 1
            try:
                await channel.write_queue.put(ChannelFrame(payload=bytes(payload), should_close=False))
            except BaseException:
                # Not queued, so the broker never sees these tags: give them back.
                channel.delivery_tag = first_tag - 1
                for tag in range(first_tag, first_tag + len(messages)):
                    channel.confirmations.pop(tag, None)
                _settle(channel, messages, first_tag, confirmations)
                raise
        try:
            return await asyncio.gather(*confirmations)
        finally:
            _settle(channel, messages, first_tag, confirmations)


def _settle(
    channel: aiormq.Channel,
    messages: Sequence[BatchMessage],
    first_tag: int,
    confirmations: list[asyncio.Future[ConfirmationFrameType | DeliveredMessage]],
) -> None:
    """Stop waiting for whatever is still pending (aiormq ignores a late answer to a
    cancelled future) and drop the ``message_id -> tag`` entries, needed only to match a
    return: once per batch, not a callback per message."""
    for confirmation in confirmations:
        confirmation.cancel()
    table = channel.message_id_delivery_tag
    for tag, message in enumerate(messages, start=first_tag):
        message_id = message.properties.message_id
        if message_id is not None and table.get(message_id) == tag:
            del table[message_id]
