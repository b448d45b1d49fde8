"""``python -m bench.node_death_raw``: the raw broker's part of a node's death on the cluster, to
set beside ``make bench-cluster``'s node kill (issue 65's ≤ 3 s).

On the 3-node cluster of ``make infra-up BROKER_NODES=3`` (4.3): a quorum queue declared as the
product declares its start queues' hand-on (``x-consumer-disconnected-timeout``, 2 s), its
leader on the first node; ``--held`` persistent messages held unacked by one consumer on the
third node, as a service holds its starts; a consumer waiting on each of the first two nodes;
then the third node killed (``kill -9``). Printed: the seconds from the kill until the first
message reaches a waiting consumer (the broker's timer) and until all have (the hand-on), and
the hand-on's rate. No service, manager or database runs: what the product adds on top of
these seconds is its own. The node is started again at the end.

    python -m bench.node_death_raw [--held 10000] [--runs 3]

Writes ``bench/results/node-death-raw-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

import aio_pika

from bench.results_file import results_path, write_results
from tools import infra

TIMEOUT_MS = 2000  # the product's x-consumer-disconnected-timeout (shared/topology.py)
_WITHIN_S = 120.0


class _Taker:
    """A consumer on one node that counts what it is given and keeps it."""

    def __init__(self, expected: int, counts: list[int], done: asyncio.Event) -> None:
        self.first_at: float | None = None
        self._expected, self._counts, self._done = expected, counts, done

    async def __call__(self, _message: aio_pika.abc.AbstractIncomingMessage) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
        self._counts[0] += 1
        if self._counts[0] >= self._expected:
            self._done.set()


async def _consumer(url: str, queue: str, prefetch: int, on_message: Any) -> aio_pika.abc.AbstractConnection:
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch)
    await (await channel.get_queue(queue, ensure=False)).consume(on_message)
    return connection


async def measure(nodes: list[infra.RabbitNode], held: int) -> dict[str, float]:
    queue = f"bench-node-death-{uuid.uuid4().hex[:6]}"
    admin = await aio_pika.connect(nodes[0].url)
    connections: list[aio_pika.abc.AbstractConnection] = []
    try:
        channel = await admin.channel()
        arguments: dict[str, Any] = {"x-queue-type": "quorum", "x-consumer-disconnected-timeout": TIMEOUT_MS}
        await channel.declare_queue(queue, durable=True, arguments=arguments)
        for first in range(0, held, 1000):
            await asyncio.gather(
                *[
                    channel.default_exchange.publish(aio_pika.Message(b"s" * 400, delivery_mode=2), routing_key=queue)
                    for _ in range(first, min(held, first + 1000))
                ]
            )
        holding, all_held = [0], asyncio.Event()
        connections.append(await _consumer(nodes[2].url, queue, held, _Taker(held, holding, all_held)))
        await asyncio.wait_for(all_held.wait(), _WITHIN_S)
        taken, all_taken = [0], asyncio.Event()
        takers = [_Taker(held, taken, all_taken) for _ in nodes[:2]]
        for node, taker in zip(nodes[:2], takers, strict=True):
            connections.append(await _consumer(node.url, queue, held, taker))
        await asyncio.sleep(1)
        began = time.monotonic()
        logging.disable(logging.ERROR)  # the holder's connection dies with its node: that is the point
        nodes[2].kill()
        await asyncio.wait_for(all_taken.wait(), _WITHIN_S)
        ended = time.monotonic()
        first_at = min(t.first_at for t in takers if t.first_at is not None)
    finally:
        for connection in connections:
            with contextlib.suppress(Exception):
                await connection.close()
        with contextlib.suppress(Exception):
            await (await admin.channel()).queue_delete(queue)
        await admin.close()
        logging.disable(logging.NOTSET)
        await asyncio.to_thread(nodes[2].start)
    return {
        "held": held,
        "first_s": round(first_at - began, 3),
        "all_s": round(ended - began, 3),
        "hand_on_per_s": round(held / max(ended - first_at, 1e-6)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--held", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    nodes = infra.broker_cluster(3)
    print(f"{'held':>7} {'first taken':>12} {'all taken':>10} {'hand-on':>10}")
    runs = []
    for _ in range(options.runs):
        run = asyncio.run(measure(nodes, options.held))
        runs.append(run)
        print(
            f"{run['held']:>7,} {run['first_s']:>11.2f}s {run['all_s']:>9.2f}s {run['hand_on_per_s']:>8,.0f}/s",
            flush=True,
        )
    path = results_path("node-death-raw")
    write_results(path, {"timeout_ms": TIMEOUT_MS, "runs": runs})
    print(f"written to {path}")


if __name__ == "__main__":
    main()
