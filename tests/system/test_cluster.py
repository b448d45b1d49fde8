"""A RabbitMQ cluster of the default series on this machine (``BROKER_NODES=3``,
``tools/infra/cluster.py``): three nodes form one cluster, a quorum queue keeps its messages
and serves clients when the node its client used is killed, and the killed node rejoins."""

from __future__ import annotations

import asyncio
import json
import uuid

import aio_pika

from tools import infra
from tools.harness import wait_for


def _running(node: infra.RabbitNode) -> list[str]:
    said = node.ctl("cluster_status", "--formatter", "json")
    return list(json.loads(said[said.index("{") :])["running_nodes"])


async def _publish(url: str, queue: str, bodies: list[bytes]) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
        for body in bodies:
            await channel.default_exchange.publish(aio_pika.Message(body, delivery_mode=2), routing_key=queue)


async def _take(url: str, queue: str, count: int) -> list[bytes]:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        q = await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
        taken = []
        for _ in range(count):
            message = await q.get(timeout=10, fail=True)
            assert message is not None
            await message.ack()
            taken.append(message.body)
        await q.delete(if_unused=False, if_empty=False)
        return taken


def test_a_cluster_of_three_keeps_a_quorum_queue_through_a_node_killed() -> None:
    nodes = infra.broker_cluster(3)
    assert sorted(_running(nodes[1])) == sorted(n.node for n in nodes)
    queue = f"cluster-test-{uuid.uuid4().hex[:8]}"
    asyncio.run(_publish(nodes[0].url, queue, [b"one", b"two"]))
    nodes[0].kill()
    try:
        wait_for(lambda: len(_running(nodes[1])) == 2, 60, "the others to see the node gone")
        asyncio.run(_publish(nodes[1].url, queue, [b"three"]))  # a majority serves the queue
        assert asyncio.run(_take(nodes[2].url, queue, 3)) == [b"one", b"two", b"three"]
    finally:
        nodes[0].start()
    wait_for(lambda: len(_running(nodes[0])) == 3, 60, "the killed node to rejoin")
