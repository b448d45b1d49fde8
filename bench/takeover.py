"""``python -m bench.takeover``: what one service pays per observer it takes over (issue 17).

``make bench-scale`` measures a failover at 1,000,000 in about half an hour, and its ratio to
raw swung between runs of the same code with how much CPU the survivors spent per start.
This measures that cost alone, in about a minute per run: a manager and service ``giver``
hold N idle observers; service ``taker`` starts empty; ``giver`` is killed (``kill -9``) and
``taker`` takes all N over. Reported per run: the time until all N are Processing on
``taker``, the CPU seconds of each part meanwhile, the taker's CPU per start split between
its main loop (starting observers) and its other threads (the holding connection: reading
deliveries), how often its starts waited for a lapsed lease, and its lease lapses.

``--load K`` runs K busy processes meanwhile: the machine saturated as in a failover at
1,000,000, where the parts compete for both cores. A cost per start that grows with the
load is a cost of slowness, not of work (``docs/cost-curve.md``).

    python -m bench.takeover                      # 100,000, unloaded then loaded with 2
    python -m bench.takeover --size 50000 --load 0,1,2 --runs 2

Results: ``bench/results/takeover-<time>.json``. No targets: the failover's target is
judged by ``bench.scale`` against raw in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import httpx

from bench import profile
from bench.fresh import create_idle, fresh_system, held_by
from bench.results_file import results_path, write_results
from bench.scale import SCALE_ENV
from bench.scenarios import BULK
from tools import infra
from tools.harness import System, free_port


@dataclass
class Takeover:
    size: int
    load: int  # busy processes running meanwhile
    seconds: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)  # per part
    taker_main_us_per_start: float = 0.0  # the main loop: starting observers
    taker_other_us_per_start: float = 0.0  # the other threads: the holding connection
    starts_awaiting_lease: float = 0.0  # times the taker's starts waited for a lapsed lease
    lease_lapses: int = 0  # the taker's "lease lapsed" warnings


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of the process's main thread and of all its other threads."""
    main = other = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # ended meanwhile
        seconds = profile.stat_cpu_seconds(fields)
        if int(task.name) == pid:
            main += seconds
        else:
            other += seconds
    return main, other


async def until_held(db: asyncpg.Connection, service_id: object, count: int, every: float) -> None:
    """Until ``service_id`` holds ``count`` observers (``held_by``)."""
    while True:
        if await held_by(db, service_id) >= count:
            return
        await asyncio.sleep(every)


async def until_moved(db: asyncpg.Connection, giver_id: object, every: float) -> None:
    """Until ``giver_id`` holds no observer (``held_by``: polling it ten times a second costs
    PostgreSQL next to nothing during the takeover)."""
    while True:
        if await held_by(db, giver_id) == 0:
            return
        await asyncio.sleep(every)


def busy_processes(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` processes that each keep a core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


async def counter(port: int, name: str) -> float:
    async with httpx.AsyncClient(timeout=30) as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def run_one(system: System, rabbit: infra.RabbitNode, size: int, load: int) -> Takeover:
    result = Takeover(size, load)
    giver = await asyncio.to_thread(system.start_service, "giver", size + 1_000, True)
    db = await asyncpg.connect(system.database_url.replace("+asyncpg", ""))
    try:
        await create_idle(system.base_url, size, f"t{load}-", BULK)
        giver_id = await db.fetchval("SELECT id FROM services WHERE pid = $1 AND status = 'alive'", giver.popen.pid)
        await until_held(db, giver_id, size, every=0.5)
        port = free_port()
        taker = await asyncio.to_thread(system.start_service, "taker", size + 1_000, True, ORCH_METRICS_PORT=str(port))
        taker_id = await db.fetchval("SELECT id FROM services WHERE pid = $1 AND status = 'alive'", taker.popen.pid)
        await asyncio.sleep(3)
        roots = {p.popen.pid for p in system.procs if p.alive()} | {
            pid for pid in (rabbit.live_pid(), infra.postgres_node().live_pid()) if pid
        }
        hogs = busy_processes(load)
        try:
            cpu_before, threads_before = profile.cpu_seconds(roots), thread_cpu(taker.popen.pid)
            awaiting_before = await counter(port, "orch_service_starts_awaiting_lease_total")
            began = time.monotonic()
            giver.kill9()
            await until_moved(db, giver_id, every=0.1)
            await until_held(db, taker_id, size, every=0.1)
            result.seconds = time.monotonic() - began
            result.cpu_s = profile.cpu_delta(cpu_before, profile.cpu_seconds(roots))
            threads_after = thread_cpu(taker.popen.pid)
        finally:
            for hog in hogs:
                hog.kill()
        result.taker_main_us_per_start = (threads_after[0] - threads_before[0]) / size * 1e6
        result.taker_other_us_per_start = (threads_after[1] - threads_before[1]) / size * 1e6
        result.starts_awaiting_lease = await counter(port, "orch_service_starts_awaiting_lease_total") - awaiting_before
        result.lease_lapses = taker.text().count("lease lapsed")
        taker.kill9()
    finally:
        await db.close()
    return result


def row(t: Takeover) -> str:
    cpu = ", ".join(f"{part} {seconds:.1f}" for part, seconds in t.cpu_s.items())
    return (
        f"{t.size:>9,} load {t.load}: {t.seconds:6.1f} s; taker per start: main {t.taker_main_us_per_start:4.0f} µs, "
        f"other threads {t.taker_other_us_per_start:4.0f} µs; waited for the lease {t.starts_awaiting_lease:.0f}x, "
        f"lapses {t.lease_lapses}; CPU s: {cpu}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--load", default="0,2", help="comma-separated numbers of busy processes, one run each")
    parser.add_argument("--runs", type=int, default=1, help="runs per load")
    args = parser.parse_args(argv)
    infra.up()
    rabbit, postgres = infra.rabbit_node(), infra.postgres_node()
    started = datetime.now(UTC)
    out = results_path("takeover", started)
    results: list[Takeover] = []
    for _ in range(args.runs):
        for load in (int(k) for k in args.load.split(",") if k.strip()):
            tag = f"bench_takeover_{int(time.time())}"
            system = fresh_system(rabbit, postgres, tag, "orch-takeover-")
            system.env |= SCALE_ENV
            try:
                system.start_manager()
                results.append(asyncio.run(run_one(system, rabbit, args.size, load)))
            finally:
                system.stop_all()
                rabbit.delete_vhost(tag, timeout=600)
                postgres.drop_database(tag)
            print(row(results[-1]), flush=True)
            write_results(out, {"started": started.isoformat(), "runs": [asdict(r) for r in results]})
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
