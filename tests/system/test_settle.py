"""Settling start deliveries by channel and tag on raw aiormq channels (``Session.ack``,
``requeue``, ``reject``), against a real broker: the service keeps only a start's body, the
channel it came on and its delivery tag (issue 17, density), and holds its starts on many
channels of a few thousand each (``HOLD_PER_CHANNEL``: RabbitMQ's cost of a settle grows
with how many its channel holds), so these are what an aio-pika or aiormq upgrade that
changed the consume path would fail."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel

from observer_service import session as session_module
from observer_service.lease import Lease
from observer_service.outbox import Outbox
from observer_service.session import Session
from observer_service.settings import ServiceSettings
from observer_service.settle import settle
from observer_service.settle_queue import DeliveryChannel
from observer_service.start_consumers import Placement
from shared import topology
from shared.messages import ControlMessage
from tools import infra

POOL = "settle"
QUEUE = topology.start_queue_name(POOL)


class Received:
    """The starts a session handed over: (body, channel, tag, redelivered), in arrival order."""

    def __init__(self) -> None:
        self.starts: list[tuple[bytes, DeliveryChannel, int, bool]] = []
        self.arrived = asyncio.Event()

    def __call__(
        self,
        body: bytes,
        channel: DeliveryChannel,
        tag: int,
        redelivered: bool,
        aside: bool,
        headers: object,
        received_at: float,
    ) -> None:
        self.starts.append((body, channel, tag, redelivered))
        self.arrived.set()

    async def until(self, count: int) -> None:
        async with asyncio.timeout(15):
            while len(self.starts) < count:
                self.arrived.clear()
                await self.arrived.wait()

    def delivery(self, body: bytes, *, redelivered: bool = False) -> tuple[DeliveryChannel, int]:
        return next((h, t) for b, h, t, r in self.starts if b == body and r == redelivered)


def _ignore_refusal(_pool: str, _hint: str | None) -> None:
    pass


def _ignore(command: ControlMessage) -> None:
    pass


@pytest.fixture
async def channel(rabbit: infra.RabbitNode, vhost: str) -> AsyncIterator[AbstractChannel]:
    connection = await aio_pika.connect(rabbit.url_for(vhost))
    channel = await connection.channel()
    await topology.declare_common(channel)
    await topology.declare_start_queue(channel, POOL)
    yield channel
    await connection.close()


@pytest.fixture
async def session(
    rabbit: infra.RabbitNode, vhost: str, channel: AbstractChannel, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Session]:
    # Two per channel: the starts below are held on several channels, and each settle must
    # name the right one (a tag on the wrong channel is a channel error, and the session dies).
    monkeypatch.setattr(session_module, "HOLD_PER_CHANNEL", 2)
    settings = ServiceSettings(amqp_url=rabbit.url_for(vhost), pools=[POOL], workers_count=10, service_name="settle")
    session = Session(settings, uuid.uuid4(), Lease(settings.amqp_heartbeat_s), settings.amqp_url)
    yield session
    await session.close()


async def _publish(channel: AbstractChannel, *bodies: bytes) -> None:
    for body in bodies:
        await channel.default_exchange.publish(topology.persistent(body), routing_key=QUEUE)


async def _bodies(channel: AbstractChannel, queue: str) -> list[bytes]:
    q = await channel.get_queue(queue)
    got = []
    while (message := await q.get(no_ack=True, fail=False)) is not None:
        got.append(message.body)
    return got


async def _ready(channel: AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    assert declared.declaration_result.message_count is not None
    return declared.declaration_result.message_count


async def test_ack_requeue_and_reject_settle_the_delivery_they_name(session: Session, channel: AbstractChannel) -> None:
    received = Received()
    await session.open(received, _ignore, _ignore_refusal, Outbox(), Placement())
    await _publish(channel, b"acked", b"requeued", b"rejected", b"held")
    await received.until(4)
    assert all(not redelivered for _, _, _, redelivered in received.starts)
    assert len({id(channel) for _, channel, _, _ in received.starts}) > 1  # the broker spreads them

    await session.ack(*received.delivery(b"acked"))
    await session.requeue(*received.delivery(b"requeued"))
    await session.reject(*received.delivery(b"rejected"))

    # Handed back to the queue: this session, the only consumer, gets it again, redelivered.
    await received.until(5)
    assert received.starts[4][0] == b"requeued" and received.starts[4][3]
    assert not session.closed.is_set()
    assert await _bodies(channel, topology.error_queue_name(QUEUE)) == [b"rejected"]
    assert await _ready(channel, QUEUE) == 0  # the rest are held, unacked, by the session

    # Every delivery still held goes back at once when the work channel closes; settling one
    # of them afterwards is refused (the broker owns it again) and ``settle`` swallows that.
    await session.requeue_held()
    with pytest.raises(Exception, match="channel of this delivery is closed"):
        await session.ack(*received.delivery(b"held"))
    await settle(session.ack(*received.delivery(b"held")))
    assert not session.closed.is_set()  # handing starts back does not end the session
    assert sorted(await _bodies(channel, QUEUE)) == [b"held", b"requeued"]  # "acked" is gone for good


async def test_no_start_arrives_once_the_consumers_are_cancelled(session: Session, channel: AbstractChannel) -> None:
    received = Received()
    await session.open(received, _ignore, _ignore_refusal, Outbox(), Placement())
    await _publish(channel, b"first")
    await received.until(1)
    await session.stop_consuming()
    await _publish(channel, b"second")
    await asyncio.sleep(0.5)
    assert [body for body, _, _, _ in received.starts] == [b"first"]
    assert await _ready(channel, QUEUE) == 1
    await session.ack(*received.delivery(b"first"))  # a held delivery stays ours to settle
    await session.requeue_held()
    assert await _bodies(channel, QUEUE) == [b"second"]
