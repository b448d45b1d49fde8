"""``python -m bench.node_death_raw``: the raw broker's part of a node's death on the cluster, to
set beside ``make bench-cluster``'s node kill (issue 65's ≤ 3 s).

On the 3-node cluster of ``make infra-up BROKER_NODES=3`` (4.3): a quorum queue declared as the
product declares its start queues' hand-on (``x-consumer-disconnected-timeout``, 2 s), its
leader on the first node; ``--held`` persistent messages held unacked by one consumer on the
third node, as a service holds its starts; ``--takers`` consumers waiting, each a process of
its own as each service is, on the first two nodes in turn; then the third node killed
(``kill -9``). Printed: the seconds from the kill until the first message reaches a waiting
consumer (the broker's timer) and until all have (the hand-on), the hand-on's rate, and the
cores each part used meanwhile (``bench/cpu_timeline.py``): the broker's own share shows how
much of the hand-on is the consumers' parsing. No service, manager or database runs: what
the product adds on top of these seconds is its own. The node is started again at the end.

    python -m bench.node_death_raw [--held 10000] [--runs 3] [--takers 2]

Writes ``bench/results/node-death-raw-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import multiprocessing
import time
import uuid
from typing import Any

import aio_pika

from bench.cpu_timeline import CpuTimeline, cores_line
from bench.results_file import results_path, write_results
from tools import infra

TIMEOUT_MS = 2000  # the product's x-consumer-disconnected-timeout (shared/topology.py)
_WITHIN_S = 120.0


class _Taker:
    """A consumer that counts what it is given and keeps it (held for good, as a service holds
    its starts), in this process."""

    def __init__(self, expected: int, counts: list[int], done: asyncio.Event) -> None:
        self._expected, self._counts, self._done = expected, counts, done

    async def __call__(self, _message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self._counts[0] += 1
        if self._counts[0] >= self._expected:
            self._done.set()


async def _consumer(url: str, queue: str, prefetch: int, on_message: Any) -> aio_pika.abc.AbstractConnection:
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch)
    await (await channel.get_queue(queue, ensure=False)).consume(on_message)
    return connection


def _take(url: str, queue: str, prefetch: int, taken: Any, times: Any, ready: Any) -> None:
    """A taker in a process of its own, as each service is: one Python consumer taking
    14,000 deliveries a second uses most of a core (the broker a fifth), so two in one process
    timed that process, not the broker. ``taken`` is shared by the takers; ``times`` gets its first and last
    delivery's ``time.monotonic`` (one clock for every process of the machine)."""

    async def on_message(_message: aio_pika.abc.AbstractIncomingMessage) -> None:
        now = time.monotonic()
        if times[0] == 0.0:
            times[0] = now
        times[1] = now
        with taken.get_lock():
            taken.value += 1

    async def consume() -> None:
        await _consumer(url, queue, prefetch, on_message)
        ready.set()
        await asyncio.Future()  # until the parent terminates this process, which closes its socket

    asyncio.run(consume())


async def measure(nodes: list[infra.RabbitNode], held: int, takers_count: int = 2) -> dict[str, Any]:
    queue = f"bench-node-death-{uuid.uuid4().hex[:6]}"
    admin = await aio_pika.connect(nodes[0].url)
    connections: list[aio_pika.abc.AbstractConnection] = []
    spawn = multiprocessing.get_context("spawn")
    taken, takers = spawn.Value("i", 0), []
    timeline, sampling = CpuTimeline(), None
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
        for node in [nodes[i % 2] for i in range(takers_count)]:
            times, ready = spawn.Array("d", 2), spawn.Event()
            process = spawn.Process(target=_take, args=(node.url, queue, held, taken, times, ready), daemon=True)
            process.start()
            takers.append((process, times))
            if not await asyncio.to_thread(ready.wait, _WITHIN_S):
                raise TimeoutError(f"a taker on {node.node} did not start consuming")
        await asyncio.sleep(1)
        sampling = asyncio.create_task(timeline.run())
        await asyncio.sleep(0.2)
        began = time.monotonic()
        logging.disable(logging.ERROR)  # the holder's connection dies with its node: that is the point
        nodes[2].kill()
        while taken.value < held:
            if time.monotonic() - began > _WITHIN_S:
                raise TimeoutError(f"{taken.value:,} of {held:,} taken")
            await asyncio.sleep(0.01)
        await asyncio.sleep(timeline.period_s * 2)
        first_at = min(times[0] for _, times in takers if times[0])
        ended = max(times[1] for _, times in takers)
    finally:
        if sampling is not None:
            sampling.cancel()
        for process, _ in takers:
            process.terminate()
            process.join(10)
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
        "takers": takers_count,
        "first_s": round(first_at - began, 3),
        "all_s": round(ended - began, 3),
        "hand_on_per_s": round(held / max(ended - first_at, 1e-6)),
        "hand_on_cores": timeline.cores(first_at, ended),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--held", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--takers", type=int, default=2, help="consumers waiting to take the starts (each a process), on two nodes"
    )
    options = parser.parse_args()
    nodes = infra.broker_cluster(3)
    print(f"{'held':>7} {'first taken':>12} {'all taken':>10} {'hand-on':>10}")
    runs = []
    for _ in range(options.runs):
        run = asyncio.run(measure(nodes, options.held, options.takers))
        runs.append(run)
        print(
            f"{run['held']:>7,} {run['first_s']:>11.2f}s {run['all_s']:>9.2f}s {run['hand_on_per_s']:>8,.0f}/s"
            f"   cores over the hand-on: {cores_line(run['hand_on_cores'])}",
            flush=True,
        )
    path = results_path("node-death-raw")
    write_results(path, {"timeout_ms": TIMEOUT_MS, "runs": runs})
    print(f"written to {path}")


if __name__ == "__main__":
    main()
