"""``python -m bench.manager_start``: how soon a started manager applies state (issue 17).

A restarted manager's backlog waits until its state process consumes the state queue: in
``make bench``'s catch-up (30,000 reports waiting) that was about 2.4 s of the 6 to 7 the
scenario took. This starts a manager ``--runs`` times on a vhost and a database of its own,
nothing else running, and reports per start the seconds from the spawn of ``python -m
manager`` until

* the state queue has a consumer (asked of the broker by a passive declare every 20 ms, on
  one connection opened before the start), and
* ``/readyz`` answers 200 (the API's half).

Each manager is stopped (SIGTERM) before the next starts. Results:
``bench/results/manager-start-<time>.json``. No target: the catch-up's is judged by ``make
bench``.

    python -m bench.manager_start --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from datetime import UTC, datetime

import aio_pika
import httpx

from bench.fresh import fresh_system
from bench.results_file import results_path, write_results
from shared import topology
from tools import infra
from tools.harness import System

_POLL_S = 0.02


async def one_start(system: System, channel: aio_pika.abc.AbstractChannel) -> dict[str, float]:
    began = time.monotonic()
    manager = system.start_manager(wait=False)
    times: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=system.base_url, timeout=1.0) as http:
        while len(times) < 2:
            if "consuming_s" not in times:
                queue = await channel.declare_queue(topology.STATE_QUEUE, passive=True)
                if queue.declaration_result.consumer_count:
                    times["consuming_s"] = time.monotonic() - began
            if "ready_s" not in times:
                try:
                    if (await http.get("/readyz")).status_code == 200:
                        times["ready_s"] = time.monotonic() - began
                except httpx.HTTPError:
                    pass
            if time.monotonic() - began > 120:
                raise TimeoutError(f"the manager did not start in 120 s:\n{manager.text()[-2000:]}")
            await asyncio.sleep(_POLL_S)
    manager.terminate()
    return times


async def measure(runs: int) -> list[dict[str, float]]:
    rabbit, postgres = infra.rabbit_node(), infra.postgres_node()
    tag = f"bench_start_{uuid.uuid4().hex[:8]}"
    system = fresh_system(rabbit, postgres, tag, "orch-bench-start-")
    try:
        connection = await aio_pika.connect(system.amqp_url)
        async with connection:
            channel = await connection.channel()
            await topology.declare_common(channel)  # as a manager declares it: polled from the first start
            return [await one_start(system, channel) for _ in range(runs)]
    finally:
        system.stop_all()
        rabbit.delete_vhost(tag)
        postgres.drop_database(tag)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    infra.up()
    started = datetime.now(UTC)
    results = asyncio.run(measure(args.runs))
    summary = {
        key: {"median": statistics.median(r[key] for r in results), "runs": [round(r[key], 3) for r in results]}
        for key in ("consuming_s", "ready_s")
    }
    for key, figures in summary.items():
        print(f"{key:<12} median {figures['median']:.2f} s   runs {figures['runs']}")
    out = results_path("manager-start", started)
    write_results(out, {"started": started.isoformat(), "runs": args.runs, "figures": summary})
    print(f"results written to {out}")


if __name__ == "__main__":
    main()
