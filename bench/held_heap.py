"""What a held start costs a classic queue's process, by the shape of the message.

A classic queue keeps every delivery its consumers hold in its process's state
(``rabbit_variable_queue``: ``record_pending_ack`` puts the message's status in
``ram_pending_ack``), and each full collection of that process copies all of it. Near
1,000,000 held starts on one queue those collections slow the creates
(docs/broker-versions.md, "Creating 1,000,000"). This asks whether the product could make
that state smaller by sending smaller starts: for each shape, N persistent messages are held
unacked by one consumer on a fresh classic queue, and the queue process's state is measured
(``erts_debug:flat_size`` of ``sys:get_state``, the live words, whatever the heap's size
step) and its heap after a collection.

Shapes: the product's own start (a ``StartObserver`` with its properties: content type,
persistent, message id), the same body with only ``delivery_mode``, and a 120-byte body
with each.

    python -m bench.held_heap [--n 100000]   # the project's broker (make infra-up)

Prints the figures and writes ``bench/results/held-heap-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from pathlib import Path
from typing import Any

import aiormq
from aiormq import spec

from bench.raw import default_amqp_url
from bench.results_file import results_path, write_results
from shared import topology
from shared.messages import StartObserver
from tools.infra.rabbitmq import RabbitNode
from tools.infra.stack import rabbit_node

_HELD_WITHIN_S = 300.0

# The queue process's live state and heap, in bytes, after a full collection.
_MEASURE = (
    '{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"{queue}">>)),'
    " P = amqqueue:get_pid(Q), erlang:garbage_collect(P),"
    " {{total_heap_size, H}} = erlang:process_info(P, total_heap_size),"
    " W = erlang:system_info(wordsize),"
    ' io:format("~b ~b~n", [erts_debug:flat_size(sys:get_state(P)) * W, H * W]).'
)


def _product_body(i: int) -> bytes:
    return StartObserver(
        observer_id=uuid.uuid4(), name=f"held-heap-{i:07d}", kind="ticker", args={"interval_s": 1.0}
    ).encode()


def _product_properties() -> spec.Basic.Properties:
    return topology.persistent_properties(str(uuid.uuid4()))


def _bare_properties() -> spec.Basic.Properties:
    return spec.Basic.Properties(delivery_mode=2)


SHAPES = {
    "the product's start": (_product_body, _product_properties),
    "its body, delivery_mode only": (_product_body, _bare_properties),
    "120 bytes, the product's properties": (lambda i: b"x" * 120, _product_properties),
    "120 bytes, delivery_mode only": (lambda i: b"x" * 120, _bare_properties),
}


def _state(rabbit: RabbitNode, queue: str) -> tuple[int, int]:
    printed = rabbit.ctl("eval", _MEASURE.format(queue=queue), timeout=600).split()
    return int(printed[0]), int(printed[1])


async def measure(url: str, rabbit: RabbitNode, shape: str, n: int) -> dict[str, Any]:
    make_body, make_properties = SHAPES[shape]
    queue = f"bench-held-heap-{uuid.uuid4().hex[:8]}"
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        await channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "classic"})
        held, all_held = 0, asyncio.Event()

        async def hold(_message: aiormq.abc.DeliveredMessage) -> None:
            nonlocal held
            held += 1
            if held >= n:
                all_held.set()

        consumer = await connection.channel()
        await consumer.basic_qos(prefetch_count=0)
        await consumer.basic_consume(queue, hold, no_ack=False)
        state_before, _ = await asyncio.to_thread(_state, rabbit, queue)
        body_bytes = len(make_body(0))
        for first in range(0, n, 1000):
            await asyncio.gather(
                *[
                    channel.basic_publish(make_body(i), routing_key=queue, properties=make_properties())
                    for i in range(first, min(n, first + 1000))
                ]
            )
        await asyncio.wait_for(all_held.wait(), _HELD_WITHIN_S)
        state, heap = await asyncio.to_thread(_state, rabbit, queue)
        await consumer.close()
        await channel.queue_delete(queue)
    finally:
        await connection.close()
    return {
        "shape": shape,
        "held": n,
        "body_bytes": body_bytes,
        "state_bytes_per_held": round((state - state_before) / n, 1),
        "heap_mib": round(heap / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    args = parser.parse_args(argv)
    url, rabbit = default_amqp_url(), rabbit_node()
    version = rabbit.ctl("eval", "rabbit_misc:version().").strip().strip('"')
    print(f"RabbitMQ {version}, classic queue, {args.n:,} held by one consumer")
    print(f"{'shape':<38} {'body':>6} {'state per held':>15} {'heap after GC':>14}")
    rows = []
    for shape in SHAPES:
        row = asyncio.run(measure(url, rabbit, shape, args.n))
        rows.append(row)
        print(
            f"{shape:<38} {row['body_bytes']:>5}B {row['state_bytes_per_held']:>14.0f}B {row['heap_mib']:>10.1f} MiB",
            flush=True,
        )
    path = results_path("held-heap")
    write_results(path, {"rabbitmq": version, "queue_type": "classic", "rows": rows})
    print(f"written to {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
