"""What holding N deliveries costs the broker while nothing else happens: the floor under the
product's idle CPU in ``make bench-scale``.

Method: a fresh durable classic queue; ``consumers`` consumer processes of ``bench.raw`` with
room for all of it; N persistent ~250-byte start messages published in batches; once all are
held, ``settle_s`` of quiet, then for each of ``minutes`` one minute of the broker's CPU seconds
(``bench.profile.cpu_seconds``: every process of the rabbitmq part) and, over the same minute,
Erlang's microstate accounting (``msacc``) summed by activity, so the figure says what the
broker spends it on (``gc`` on dirty CPU schedulers is the garbage collection of processes with
large heaps, such as a queue holding N). Nothing publishes, consumes or acks meanwhile; the
consumers' AMQP heartbeats are the only traffic.

    python -m bench.idle_floor [--n 1000000] [--minutes 3] [--queue-version 2] [--queue-mode lazy]
    # URL from ORCH_AMQP_URL or .run/env

``--queue-version 2`` declares the queue with ``x-queue-version: 2``, RabbitMQ's second storage
version of classic queues (opt-in on 3.10, the only one from 4.0), to compare with the
broker's default; ``--queue-mode lazy`` a classic queue that keeps its messages on disk rather
than in memory (3.x only). Without either, the queue gets no such argument: 4.3 refuses
``x-queue-mode`` and ``x-queue-version: 1``.
Each minute also names the five processes that did the most work in it (reductions) and
their heaps.

Prints the figures and writes ``bench/results/idle-floor-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import aio_pika

from bench import profile
from bench.broker_work import busy_seconds
from bench.raw import _Fleet, _publish_batched, _start_message, default_amqp_url
from bench.results_file import results_path, write_results
from tools.infra.stack import rabbit_node

SETTLE_S = 20.0
# One minute of microstate accounting, summed per (thread type, activity), in microseconds.
_MSACC = (
    "Snap = fun() -> maps:from_list([{P, R} || P <- erlang:processes(),"
    " {reductions, R} <- [erlang:process_info(P, reductions)]]) end,"
    " S0 = Snap(),"
    "msacc:start(60000), Stats = lists:foldl(fun(#{type := T, counters := C}, Acc) -> maps:fold("
    "fun(K, V, A) -> maps:update_with({T, K}, fun(X) -> X + V end, V, A) end, Acc, C) end,"
    " #{}, msacc:stats()),"
    " S1 = Snap(),"
    " Delta = lists:reverse(lists:keysort(2, [{P, R - maps:get(P, S0, 0)} || {P, R} <- maps:to_list(S1)])),"
    " Top = [lists:flatten(io_lib:format('top ~p reductions=~b heap_words=~b', [proc_lib:translate_initial_call(P),"
    " D, case erlang:process_info(P, total_heap_size) of {_, H} -> H; _ -> 0 end]))"
    " || {P, D} <- lists:sublist(Delta, 5)],"
    " {Stats, Top}."
)
# The processes that did most work in the minute: what they are (initial call), how many
# reductions, and their heap (a large one is what the dirty schedulers' collections copy).
_TOP = re.compile(r"top \{(\w+),(\w+),(\d+)\} reductions=(\d+) heap_words=(\d+)")


def busiest_processes(msacc_output: str) -> list[dict[str, object]]:
    """The top of the minute by reductions: ``{"process": "m:f/a", "reductions", "heap_mib"}``."""
    return [
        {"process": f"{m}:{f}/{a}", "reductions": int(r), "heap_mib": round(int(h) * 8 / 2**20, 1)}
        for m, f, a, r, h in _TOP.findall(msacc_output)
    ]


async def _keep_awake(channel: aio_pika.abc.AbstractChannel, queue_name: str, every_s: float) -> None:
    """A passive declare is a call to the queue process: one every ``every_s`` keeps it from
    going idle long enough to hibernate."""
    while True:
        await channel.declare_queue(queue_name, passive=True)
        await asyncio.sleep(every_s)


async def measure(
    url: str, n: int, consumers: int, minutes: int, queue_version: int | None, queue_mode: str, keep_awake_s: float
) -> dict[str, object]:
    node = rabbit_node()
    queue_name = f"bench.idle-floor.{uuid.uuid4()}"
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        arguments: dict[str, Any] = {"x-queue-type": "classic"}
        if queue_version is not None:
            arguments["x-queue-version"] = queue_version
        if queue_mode != "default":
            arguments["x-queue-mode"] = queue_mode
        await channel.declare_queue(queue_name, durable=True, arguments=arguments)
        fleet = _Fleet()
        awake: asyncio.Task[None] | None = None
        try:
            await fleet.start(url, queue_name, n, consumers)
            began = time.monotonic()
            await _publish_batched(channel, queue_name, [_start_message(i) for i in range(n)])
            await fleet.wait_held(n, "all held")
            hold_s = time.monotonic() - began
            print(f"{n:,} held by {consumers} consumers in {hold_s:.1f} s; quiet for {SETTLE_S:.0f} s", flush=True)
            if keep_awake_s > 0:
                awake = asyncio.create_task(_keep_awake(await connection.channel(), queue_name, keep_awake_s))
            await asyncio.sleep(SETTLE_S)
            per_minute = []
            for minute in range(minutes):
                cpu, t0 = profile.broker_cpu(), time.monotonic()
                output = await asyncio.to_thread(node.ctl, "eval", _MSACC)
                seconds = profile.broker_cpu() - cpu
                busy, top = busy_seconds(output), busiest_processes(output)
                per_minute.append(
                    {"cpu_s": round(seconds, 2), "wall_s": round(time.monotonic() - t0, 1), "busy": busy, "top": top}
                )
                print(f"minute {minute + 1}: broker {seconds:.2f} CPU s; busiest: {busy}", flush=True)
                for process in top:
                    print(f"    {process}", flush=True)
        finally:
            if awake is not None:
                awake.cancel()
            await fleet.close()
            await channel.queue_delete(queue_name)
    cpu_s = [m["cpu_s"] for m in per_minute]
    return {
        "n": n,
        "consumers": consumers,
        "queue_version": queue_version,
        "queue_mode": queue_mode,
        "keep_awake_s": keep_awake_s,
        "hold_s": round(hold_s, 1),
        "minutes": per_minute,
        "cpu_s_per_min": cpu_s,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.idle_floor", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="deliveries held (default 1000000)")
    parser.add_argument("--consumers", type=int, default=3, help="consumer processes (default 3)")
    parser.add_argument("--minutes", type=int, default=3, help="minutes measured (default 3)")
    parser.add_argument(
        "--queue-version", type=int, choices=(1, 2), default=None, help="classic queue version (default: the broker's)"
    )
    parser.add_argument(
        "--queue-mode", choices=("default", "lazy"), default="default", help="classic queue mode (default: default)"
    )
    parser.add_argument(
        "--keep-awake", type=float, default=0.0, help="passive-declare the queue every this many seconds (0: never)"
    )
    args = parser.parse_args(argv)
    result = asyncio.run(
        measure(
            default_amqp_url(),
            args.n,
            args.consumers,
            args.minutes,
            args.queue_version,
            args.queue_mode,
            args.keep_awake,
        )
    )
    path = results_path("idle-floor")
    write_results(path, result)
    print(f"broker CPU s per idle minute holding {args.n:,}: {result['cpu_s_per_min']}; written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
