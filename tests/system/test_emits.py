"""``observer_service.emits.EventPublisher`` against a real broker: emits are batched, and each
still returns only once its own message is confirmed, or fails with ``LeaseLost``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractQueue

from observer_service.emits import MAX_BATCH, EventPublisher
from observer_service.lease import Lease
from shared import topology
from shared.errors import LeaseLost
from tools import infra


@pytest.fixture
async def connection(rabbit: infra.RabbitNode, vhost: str) -> AsyncIterator[AbstractConnection]:
    conn = await aio_pika.connect(rabbit.url_for(vhost))
    yield conn
    if not conn.is_closed:
        await conn.close()


async def _events_queue(channel: AbstractChannel) -> AbstractQueue:
    await topology.declare_common(channel)
    queue = await channel.declare_queue("events-seen", durable=True)
    await queue.bind(topology.EVENTS_EXCHANGE, routing_key="#")
    return queue


def _renewed_lease() -> Lease:
    lease = Lease(heartbeat_s=60)
    lease.renew(time.monotonic())
    return lease


async def _publisher(connection: AbstractConnection, lease: Lease, failures: list[str]) -> EventPublisher:
    channel = await connection.channel(publisher_confirms=True)
    return EventPublisher(await channel.get_underlay_channel(), lease, failures.append)


async def test_concurrent_emits_are_each_confirmed_and_arrive_in_each_observers_order(
    connection: AbstractConnection,
) -> None:
    queue = await _events_queue(await connection.channel())
    failures: list[str] = []
    events = await _publisher(connection, _renewed_lease(), failures)
    observers, per_observer = 50, 3 * MAX_BATCH // 50  # more than one batch at once

    async def observer(n: int) -> None:
        for i in range(per_observer):
            await events.publish(f"ticker.o{n}", f"{n}:{i}".encode())

    await asyncio.gather(*(observer(n) for n in range(observers)))

    seen: dict[str, list[int]] = {}
    for _ in range(observers * per_observer):
        message = await queue.get(no_ack=True, timeout=10)
        assert message is not None
        n, i = message.body.decode().split(":")
        assert message.routing_key == f"ticker.o{n}"
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        seen.setdefault(n, []).append(int(i))
    assert await queue.get(no_ack=True, fail=False) is None
    assert seen == {str(n): list(range(per_observer)) for n in range(observers)}
    assert failures == []
    await events.close("done")


async def test_an_emit_after_the_lease_lapsed_is_refused_and_not_published(connection: AbstractConnection) -> None:
    queue = await _events_queue(await connection.channel())
    lease, failures = _renewed_lease(), list[str]()
    events = await _publisher(connection, lease, failures)
    await events.publish("ticker.a", b"before")
    lease.revoke()

    with pytest.raises(LeaseLost):
        await events.publish("ticker.a", b"after")

    bodies = []
    while (message := await queue.get(no_ack=True, fail=False, timeout=5)) is not None:
        bodies.append(message.body)
    assert bodies == [b"before"]
    assert failures == [], "a lapsed lease pauses emits; it does not end the session"
    await events.close("done")


async def test_a_lost_channel_fails_the_waiting_emits_and_ends_the_session(connection: AbstractConnection) -> None:
    await _events_queue(await connection.channel())
    failures: list[str] = []
    events = await _publisher(connection, _renewed_lease(), failures)
    await events.publish("ticker.a", b"first")
    await connection.close()

    results = await asyncio.gather(*(events.publish("ticker.a", b"%d" % i) for i in range(20)), return_exceptions=True)

    assert all(isinstance(r, LeaseLost) for r in results), results
    assert len(failures) == 1 and "event publish failed" in failures[0]
    with pytest.raises(LeaseLost):
        await events.publish("ticker.a", b"later")
    await events.close("done")


async def test_closing_fails_what_waits_with_lease_lost(connection: AbstractConnection) -> None:
    await _events_queue(await connection.channel())
    events = await _publisher(connection, _renewed_lease(), [])
    waiting = [asyncio.create_task(events.publish("ticker.a", b"%d" % i)) for i in range(100)]
    await asyncio.sleep(0)  # queued, not yet confirmed

    await events.close("session closed")

    results = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(r is None or isinstance(r, LeaseLost) for r in results), results
    with pytest.raises(LeaseLost):
        await events.publish("ticker.a", b"later")
