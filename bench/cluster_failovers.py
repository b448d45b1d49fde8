"""The broker's half of ``python -m bench.cluster`` (``--only failovers``): what a start held
in a quorum start queue costs each node, and the broker's disk after many failovers.

* Each node's memory per start held (50,000 of them held by one consumer, read by the broker
  after a garbage collection: ``bench/broker_memory.py``) and its data folder's growth.
* ``failovers``: on a start queue declared as the product declares it (quorum), H starts are
  taken and held as services hold them (prefetch, ``HELD_FOR_GOOD``) by a connection that then
  closes, F times, each time from the next node; reported: the starts left and dead-lettered
  (the delivery limit), and each node's data folder before and after, so a user can size
  disks. The holders are bare connections, not services: the broker's work per failover is
  the same, and 1,000 failovers of real services would take hours on 2 cores.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika

from bench.broker_memory import broker_memory_kib
from shared import topology
from tools import infra

_MEMORY_STARTS = 50_000


@dataclass
class Failovers:
    holders: int
    held: int
    left: int = 0
    dead_lettered: int = 0
    seconds: float = 0.0
    kib_per_start: dict[str, float] = field(default_factory=dict)  # each node's memory per held start
    disk_kib_per_start: dict[str, float] = field(default_factory=dict)  # and its data folder's growth
    node_bytes_before: dict[str, int] = field(default_factory=dict)
    node_bytes_after: dict[str, int] = field(default_factory=dict)


def folder_bytes(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


async def hold(url: str, queue: str, count: int, timeout_s: float) -> aio_pika.abc.AbstractConnection:
    """A connection holding ``count`` starts of ``queue``, taken as a service takes them
    (prefetch, ``HELD_FOR_GOOD``, no ack)."""
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=count)
    got = 0
    all_held = asyncio.get_running_loop().create_future()

    async def take(_message: aio_pika.abc.AbstractIncomingMessage) -> None:
        nonlocal got
        got += 1
        if got == count and not all_held.done():
            all_held.set_result(None)

    await (await channel.get_queue(queue, ensure=False)).consume(take, arguments=topology.HELD_FOR_GOOD)
    await asyncio.wait_for(all_held, timeout_s)
    return connection


async def publish(channel: aio_pika.abc.AbstractChannel, queue: str, count: int) -> None:
    """``count`` persistent starts, a thousand confirms awaited at a time."""
    for first in range(0, count, 1000):
        await asyncio.gather(
            *(
                channel.default_exchange.publish(topology.persistent(f'{{"n": {i}}}'.encode()), routing_key=queue)
                for i in range(first, min(count, first + 1000))
            )
        )


async def memory_per_start(
    channel: aio_pika.abc.AbstractChannel, nodes: list[infra.RabbitNode], url: str, count: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Each node's memory and data folder (KiB) per start held in a quorum start queue, from
    ``count`` held by one consumer as a service holds them."""
    queue = await topology.declare_start_queue(channel, "memory", "quorum")
    before = {n.node: broker_memory_kib(n) for n in nodes}
    disk_before = {n.node: folder_bytes(n.mnesia_base) for n in nodes}
    await publish(channel, queue.name, count)
    holder = await hold(url, queue.name, count, 300)
    try:
        after = {n.node: broker_memory_kib(n) for n in nodes}
        disk_after = {n.node: folder_bytes(n.mnesia_base) for n in nodes}
    finally:
        await holder.close()
    await queue.delete(if_unused=False, if_empty=False)
    memory = {node: (after[node] - before[node]) / count for node in before}
    disk = {node: (disk_after[node] - disk_before[node]) / 1024 / count for node in before}
    return memory, disk


async def failovers(nodes: list[infra.RabbitNode], vhost: str, held: int, count: int) -> Failovers:
    result = Failovers(holders=count, held=held)
    urls = [node.url_for(vhost) for node in nodes]
    connection = await aio_pika.connect(urls[0])
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await topology.declare_common(channel, "quorum")
        result.kib_per_start, result.disk_kib_per_start = await memory_per_start(
            channel, nodes, urls[1], _MEMORY_STARTS
        )
        queue = await topology.declare_start_queue(channel, "default", "quorum")
        await publish(channel, queue.name, held)
        result.node_bytes_before = {n.node: folder_bytes(n.mnesia_base) for n in nodes}
        began = time.monotonic()
        for i in range(count):
            await (await hold(urls[i % len(urls)], queue.name, held, 60)).close()
        result.seconds = time.monotonic() - began
        result.node_bytes_after = {n.node: folder_bytes(n.mnesia_base) for n in nodes}
        error = await channel.get_queue(topology.error_queue_name(queue.name), ensure=False)
        result.left = (await queue.declare()).message_count or 0
        result.dead_lettered = (await error.declare()).message_count or 0
    return result


def print_failovers(done: Failovers) -> None:
    print(
        f"\n{done.holders:,} failovers of {done.held:,} held starts in {done.seconds:.0f} s: "
        f"{done.left:,} left, {done.dead_lettered:,} dead-lettered"
    )
    for node, before in done.node_bytes_before.items():
        after = done.node_bytes_after[node]
        print(
            f"  {node}: data {before / 2**20:,.1f} MiB before, {after / 2**20:,.1f} MiB after; "
            f"per held start: memory {done.kib_per_start[node]:.2f} KiB, data {done.disk_kib_per_start[node]:.2f} KiB"
        )
