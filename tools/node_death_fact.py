"""``python -m tools.node_death_fact``: how long a quorum queue keeps the delivery of a consumer
whose node was killed (docs/design.md, "How soon the starts of a dead node may move").

On the 3-node cluster of ``make infra-up BROKER_NODES=3`` (4.3), for the queue argument
``x-consumer-disconnected-timeout`` and then for the policy key ``consumer-disconnected-timeout``
on a queue declared without it: one message held by a consumer on the third node, a second
consumer waiting on the second node, the third node killed (``kill -9``); printed: the seconds
until the second consumer has the message, and whether a redeclare without the argument is
accepted. The node is started again at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
import uuid
from typing import Any

import aio_pika
import aiormq

from tools import infra

_POLICY = "node-death-fact"


async def _consume(url: str, queue: str) -> tuple[aio_pika.abc.AbstractConnection, asyncio.Event]:
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.set_qos(1)
    got = asyncio.Event()

    async def hold(_message: aio_pika.abc.AbstractIncomingMessage) -> None:
        got.set()  # never acked: held until the connection dies

    await (await channel.get_queue(queue, ensure=False)).consume(hold)
    return connection, got


async def measure(nodes: list[infra.RabbitNode], timeout_ms: int, by_policy: bool) -> None:
    queue = f"node-death-fact-{uuid.uuid4().hex[:6]}"
    args: dict[str, Any] = {"x-queue-type": "quorum"}
    if by_policy:
        rule = f'{{"consumer-disconnected-timeout": {timeout_ms}}}'
        nodes[0].ctl("set_policy", "--apply-to", "quorum_queues", _POLICY, "^node-death-fact-", rule)
        await asyncio.sleep(2)  # the policy reaches the queues
    else:
        args["x-consumer-disconnected-timeout"] = timeout_ms
    admin = await aio_pika.connect(nodes[0].url)
    try:
        channel = await admin.channel()
        await channel.declare_queue(queue, durable=True, arguments=args)
        await channel.default_exchange.publish(aio_pika.Message(b"start", delivery_mode=2), routing_key=queue)
        _holder, held = await _consume(nodes[2].url, queue)
        await asyncio.wait_for(held.wait(), 10)
        waiting, taken = await _consume(nodes[1].url, queue)
        await asyncio.sleep(1)
        began = time.monotonic()
        nodes[2].kill()
        await asyncio.wait_for(taken.wait(), 180)
        how = "policy" if by_policy else "argument"
        print(f"{how} {timeout_ms} ms: taken on another node {time.monotonic() - began:.2f} s after the kill")
        try:
            await (await admin.channel()).declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
            print("  a redeclare without the argument: accepted")
        except aiormq.exceptions.AMQPChannelError as e:
            print(f"  a redeclare without the argument: refused ({e})")
        await waiting.close()
        await (await admin.channel()).queue_delete(queue)
    finally:
        await admin.close()
        if by_policy:
            nodes[0].ctl("clear_policy", _POLICY)
        await asyncio.to_thread(nodes[2].start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout-ms", type=int, default=2000)
    options = parser.parse_args()
    logging.disable(logging.ERROR)  # the holder's connection dies with its node: that is the point
    nodes = infra.broker_cluster(3)
    for by_policy in (False, True):
        asyncio.run(measure(nodes, options.timeout_ms, by_policy))


if __name__ == "__main__":
    main()
