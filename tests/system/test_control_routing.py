"""Control commands against a real broker, through the manager's own ``BrokerLink``: a
command that names a service goes to that service's queue only, a broadcast to every
service, and a command for a service that is gone is dropped (no queue, no error)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractConnection

from manager.broker import BrokerLink
from manager.settings import ManagerSettings
from shared import topology
from shared.messages import ControlMessage, InventoryRequest, StopObservers, decode_control
from tools import infra


@pytest.fixture
async def connection(rabbit: infra.RabbitNode, vhost: str) -> AsyncIterator[AbstractConnection]:
    conn = await aio_pika.connect(rabbit.url_for(vhost))
    yield conn
    await conn.close()


async def _received(queue: aio_pika.abc.AbstractQueue) -> list[ControlMessage]:
    got = []
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        got.append(decode_control(message.body))
    return got


async def test_a_command_for_one_service_reaches_only_its_queue(
    rabbit: infra.RabbitNode, vhost: str, connection: AbstractConnection
) -> None:
    link = BrokerLink(ManagerSettings(amqp_url=rabbit.url_for(vhost)))
    link.start()
    try:
        await asyncio.wait_for(link.ready.wait(), 30)
        await _check_routes(link, connection)
    finally:
        await link.close()


async def _check_routes(link: BrokerLink, connection: AbstractConnection) -> None:
    channel = await connection.channel()
    a, b, gone = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    queues = {sid: await topology.declare_control_queue(channel, sid) for sid in (a, b)}

    to_a = StopObservers(observer_ids=[uuid.uuid4() for _ in range(3)], service_id=a, reason="moved to another service")
    to_everyone = StopObservers(observer_ids=[uuid.uuid4()], reason="requested")
    to_gone = StopObservers(observer_ids=[uuid.uuid4()], service_id=gone, reason="moved to another service")
    ask_b = InventoryRequest(service_id=b)
    for message in (to_a, to_gone, to_everyone, ask_b):
        await link.publish_control(message)  # confirmed, or it raises

    async def arrived() -> bool:
        counts = [(await q.declare()).message_count or 0 for q in queues.values()]
        return all(count > 0 for count in counts)

    for _ in range(100):
        if await arrived():
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)  # anything misrouted would have arrived by now too
    assert [m.message_id for m in await _received(queues[a])] == [to_a.message_id, to_everyone.message_id]
    assert [m.message_id for m in await _received(queues[b])] == [to_everyone.message_id, ask_b.message_id]
