"""How the broker takes back N held deliveries: one ``basic.nack(requeue)`` each, or a channel
close (the broker requeues the closed channel's unacked deliveries itself).

Why it matters: a service that shuts down gracefully hands every observer's start back. On
RabbitMQ 3.10's classic queues the cost of one-by-one requeues grows with the square of their
number, and the queue process serves nobody while it works, so the service hands them back
by closing its work channel instead (``Session.requeue_held``).

For each N: publish N persistent messages to a fresh queue, hold them all unacked with one
consumer (prefetch N), cancel the consumer (as a stopping service does), then hand them back
and measure the time until the queue reports N ready, and the broker's CPU seconds meanwhile.

    python -m bench.requeue [--n 5000 10000 20000]   # URL from ORCH_AMQP_URL or .run/env
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import cast

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from aiormq import spec

from bench import profile
from bench.raw import default_amqp_url
from shared.batch_publish import BatchMessage, publish_batch

_READY_TIMEOUT_S = 600.0


async def _held(channel: AbstractChannel, queue: str, n: int) -> list[AbstractIncomingMessage]:
    await channel.set_qos(prefetch_count=n)
    held: list[AbstractIncomingMessage] = []
    all_held = asyncio.Event()

    async def on_message(message: AbstractIncomingMessage) -> None:
        held.append(message)
        if len(held) == n:
            all_held.set()

    q = await channel.get_queue(queue)
    tag = await q.consume(on_message)
    await asyncio.wait_for(all_held.wait(), _READY_TIMEOUT_S)
    await q.cancel(tag)  # as a stopping service does first
    return held


async def measure(url: str, how: str, n: int) -> tuple[float, float]:
    """(seconds until all N are ready again, broker CPU seconds meanwhile)."""
    connection = await aio_pika.connect(url)
    async with connection:
        pub = await connection.channel(publisher_confirms=True)
        queue = await pub.declare_queue(f"bench.requeue.{uuid.uuid4()}", durable=True)
        try:
            raw = cast(aiormq.Channel, await pub.get_underlay_channel())
            body = b"x" * 250
            for first in range(0, n, 1000):
                batch = [
                    BatchMessage(queue.name, body, spec.Basic.Properties(delivery_mode=2, message_id=f"{first + i}"))
                    for i in range(min(1000, n - first))
                ]
                await publish_batch(raw, batch, timeout=60)
            work = await connection.channel()
            held = await _held(work, queue.name, n)
            cpu, began = profile.broker_cpu(), time.monotonic()
            if how == "nack":
                for message in held:
                    await message.nack(requeue=True)
            else:
                await work.close()
            while (await pub.declare_queue(queue.name, passive=True)).declaration_result.message_count != n:
                if time.monotonic() - began > _READY_TIMEOUT_S:
                    raise TimeoutError(f"{n} not ready after {_READY_TIMEOUT_S:g}s")
                await asyncio.sleep(0.02)
            return time.monotonic() - began, profile.broker_cpu() - cpu
        finally:
            await queue.delete(if_unused=False, if_empty=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[5000, 10000, 20000])
    args = parser.parse_args()
    url = default_amqp_url()
    print(f"{'how':<14} {'N':>7} {'ready again':>12} {'broker CPU':>11}")
    for n in args.n:
        for how, label in (("close", "channel close"), ("nack", "nack each")):
            seconds, cpu = asyncio.run(measure(url, how, n))
            print(f"{label:<14} {n:>7,} {seconds:>11.2f}s {cpu:>10.2f}s", flush=True)


if __name__ == "__main__":
    main()
