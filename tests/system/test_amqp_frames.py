"""``shared.amqp_frames`` against a real broker: installed, it is what aiormq's connections read
with, and a connection reads through it as through aiormq's own receiver: bodies of many
frames, the broker's heartbeats, the broker's close. An aiormq upgrade that builds its
receiver another way fails here."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aio_pika
import aiormq.connection
import pytest
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

from shared import amqp_frames
from tools import infra


@pytest.fixture
def installed() -> Iterator[None]:
    original = aiormq.connection.FrameReceiver
    amqp_frames.install()
    yield
    aiormq.connection.FrameReceiver = original  # type: ignore[misc]


@pytest.fixture
async def connection(installed: None, rabbit: infra.RabbitNode, vhost: str) -> AsyncIterator[AbstractConnection]:
    name = f"frames-{uuid.uuid4().hex[:8]}"
    conn = await aio_pika.connect(rabbit.url_for(vhost), heartbeat=1, client_properties={"connection_name": name})
    conn.name = name  # type: ignore[attr-defined]  # for the broker's listing
    yield conn
    await conn.close()


def _receiver(connection: AbstractConnection) -> object:
    """The frame receiver the connection's reader task iterates."""
    underlay: Any = connection.transport.connection  # type: ignore[union-attr]
    return underlay._reader_task.get_coro().cr_frame.f_locals["frame_receiver"]


async def test_a_connection_reads_every_body_whole_through_the_buffered_receiver(
    connection: AbstractConnection,
) -> None:
    assert type(_receiver(connection)) is amqp_frames.BufferedFrameReceiver
    channel = await connection.channel()
    queue = await channel.declare_queue(f"frames-{uuid.uuid4().hex[:8]}", durable=True)
    big = bytes(range(256)) * 1200  # 300 KiB: three body frames, more than one read
    bodies = [f"m{i}".encode() * (i % 7) for i in range(2000)]
    bodies[5], bodies[1500] = big, big[:131072]
    for body in bodies:
        await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue.name)

    got: list[bytes] = []
    done = asyncio.Event()

    async def take(message: AbstractIncomingMessage) -> None:
        got.append(message.body)
        await message.ack()
        if len(got) == len(bodies):
            done.set()

    await queue.consume(take)
    async with asyncio.timeout(30):
        await done.wait()
    assert got == bodies


async def test_an_idle_connection_lives_on_the_brokers_heartbeats(connection: AbstractConnection) -> None:
    """aiormq cancels a reader that has received no frame for a few heartbeats: the broker's
    heartbeats must come through the receiver."""
    await asyncio.sleep(4)  # four heartbeat intervals, nothing else sent
    assert not connection.is_closed
    channel = await connection.channel()
    await channel.declare_queue(f"frames-{uuid.uuid4().hex[:8]}", durable=True)


async def test_the_brokers_close_reaches_the_connection(
    connection: AbstractConnection, rabbit: infra.RabbitNode
) -> None:
    name = connection.name  # type: ignore[attr-defined]
    closed: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    def on_close(_sender: object, exc: BaseException | None) -> None:
        if not closed.done():
            closed.set_result(exc)

    connection.close_callbacks.add(on_close)
    props = await asyncio.to_thread(
        rabbit.ctl, "-q", "list_connections", "--no-table-headers", "pid", "client_properties"
    )
    pids = [line.split("\t")[0] for line in props.splitlines() if f'"{name}"' in line]
    assert len(pids) == 1, props
    await asyncio.to_thread(rabbit.ctl, "close_connection", pids[0], "test: closed by the broker")
    async with asyncio.timeout(10):
        exc = await closed
    assert "closed by the broker" in repr(exc)
