"""``make bench-scale``: the cost curve to 1,000,000 observers on this machine (issue 17).

For each size (10,000, 100,000, 300,000 and 1,000,000) and workload (``idle``: the ``idle``
kind, no timer and no emit; ``emitting``: tickers emitting once a minute), on a fresh vhost,
database, manager and three services, each with room for half the size (two must hold all
after a kill):

1. create N in bulk (8 requests of 1,000 in flight): the accepted rate and the time until
   all are Processing;
2. memory per observer: service RSS, broker RSS and the PostgreSQL database's size (table,
   indexes and history), each the growth over the empty system;
3. 60 s of steady running: CPU seconds per part (an idle fleet must cost almost nothing),
   and the events delivered per second (the services' ``orch_service_emits_total``);
4. API p99 while they run: a list page of 100, a get, the stats;
5. ``kill -9`` of the service with the most: the time until all are Processing elsewhere,
   as a ratio to raw's redelivery of the same share, and the CPU seconds each part used
   meanwhile (with ``--profile``, py-spy's stacks of the manager and the survivors too, and
   of a second quiet minute after step 3's);
6. a stop of 10 %: the time until all are Deleted;
7. false deaths over the whole point (``bench/deaths.py``; the killed service excluded);
8. raw, once the product is gone, on an empty vhost: the broker alone (``bench/raw.py``, no
   product code on the path): N messages held by three consumers, one killed, the time until
   its share is held again, with the broker's work meanwhile recorded as in step 5.

A point that does not complete is kept with the step it stopped at and what ran out: the
machine's available memory at its lowest, a process that died (and its exit code), or the
step's time limit. Results: ``bench/results/scale-<time>.json`` and ``.png`` (the curve,
``bench/curve.py``).

    python -m bench.scale                                      # make bench-scale
    python -m bench.scale --sizes 10000,100000 --workloads idle
    python -m bench.scale --sizes 300000 --workloads idle --profile        # where failover goes
    python -m bench.scale --from bench/results/scale-<time>.json scale-<time2>.json   # one table and curve
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench import broker_work, curve, profile
from bench.broker_memory import broker_memory_kib
from bench.curve import Point
from bench.deaths import Killed, close_ledger, open_ledger
from bench.figures import latencies_ms, percentile, rss_kib
from bench.fresh import busiest_host, fresh_system, held_by
from bench.raw import arun_raw
from bench.results_file import RESULTS, results_path, stamp
from bench.scenarios import BENCH_ENV, BULK
from manager.settings import ManagerSettings
from observer_service.settings import ServiceSettings
from tools import infra
from tools.harness import FAST_ENV, Proc, System, free_port

SIZES = (10_000, 100_000, 300_000, 1_000_000)
WORKLOADS: dict[str, tuple[str, dict[str, Any]]] = {
    "idle": ("idle", {}),
    "emitting": ("ticker", {"interval_s": 60}),
}
STEADY_S = 60


def product_defaults() -> dict[str, str]:
    """The product's own default for every setting the test harness (``FAST_ENV``) and
    ``make bench`` (``BENCH_ENV``) change: the curve measures the system as a user runs it.
    Until 2026-11-26 it ran with ``BENCH_ENV`` over the harness's clocks, a heartbeat every
    2 s (default 5) and a pass of the manager's repairs every 0.5 s (default 1), which an idle minute
    pays for. Logging stays at warnings: a line per observer start would be most of the work."""
    env = {}
    for name in sorted(FAST_ENV.keys() | BENCH_ENV.keys()):
        setting = name.removeprefix("ORCH_").lower()
        for settings in (ServiceSettings, ManagerSettings):
            info = settings.model_fields.get(setting)
            if info is not None and info.default is not None:
                env[name] = str(info.default)
    return env | {"ORCH_LOG_LEVEL": "WARNING"}


SCALE_ENV = product_defaults()


def available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _p99_bound(counters: dict[str, float]) -> float:
    """The upper bound of the bucket that holds the 99th percentile lease round trip."""
    buckets = sorted(
        (float(name.split('le="')[1].split('"')[0]), count)
        for name, count in counters.items()
        if name.startswith("orch_service_lease_round_trip_seconds_bucket")
    )
    total = buckets[-1][1] if buckets else 0.0
    return next((bound for bound, count in buckets if count >= 0.99 * total), 0.0) if total else 0.0


class Watch:
    """Samples the machine's available memory and the product's processes every second:
    when a step fails, what ran out."""

    def __init__(self, procs: list[Proc]) -> None:
        self.procs = procs
        self.lowest_mib = available_mib()
        self.died: list[str] = []
        self.killed_pids: set[int] = set()  # killed on purpose: not a death to report

    async def run(self) -> None:
        while True:
            self.lowest_mib = min(self.lowest_mib, available_mib())
            for proc in self.procs:
                code = proc.popen.poll()
                note = f"{proc.name} (pid {proc.popen.pid}) exited with {code}"
                if code is not None and note not in self.died and proc.popen.pid not in self.killed_pids:
                    self.died.append(note)
            await asyncio.sleep(1)

    def diagnosis(self) -> str:
        parts = [f"lowest available memory {self.lowest_mib:,.0f} MiB"]
        if self.died:
            parts.append("; ".join(self.died))
        return ", ".join(parts)


class ScalePoint:
    def __init__(
        self, system: System, point: Point, rabbit: infra.RabbitNode, watch: Watch, profile_dir: Path | None = None
    ) -> None:
        self.system = system
        self.profile_dir = profile_dir
        self.watch = watch
        self.point = point
        self.rabbit = rabbit
        self.http = httpx.AsyncClient(base_url=system.base_url, timeout=300, limits=httpx.Limits(keepalive_expiry=1))
        self.services: list[Proc] = []
        self.metrics_ports: dict[int, int] = {}  # service pid -> its /metrics port
        self.db: asyncpg.Connection | None = None

    # --- helpers -------------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        body: dict[str, Any] = (await self.http.get("/api/stats")).json()
        return body

    async def until(self, check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> float:
        began = time.monotonic()
        while not await check():
            if time.monotonic() - began > timeout:
                raise TimeoutError(f"{what} not reached in {timeout:g}s")
            await asyncio.sleep(0.1)  # the poll's granularity is part of every time measured
        return time.monotonic() - began

    async def count(self, status: str) -> int:
        return int((await self.stats())["observers"].get(status, 0))

    async def bulk_create(self, count: int, kind: str, args: dict[str, Any]) -> list[float]:
        """Create ``count`` in requests of ``BULK``, 8 in flight; returns when each was
        accepted (monotonic seconds, in order)."""
        gate = asyncio.Semaphore(8)
        accepted: list[float] = []

        async def send(start: int) -> None:
            body = {"observers": [{"name": f"s-{i}", "kind": kind, "args": args} for i in range(start, start + BULK)]}
            for _ in range(30):
                async with gate:
                    response = await self.http.post("/api/observers/bulk", json=body)
                if response.status_code != 503:
                    response.raise_for_status()
                    accepted.append(time.monotonic())
                    return
                await asyncio.sleep(float(response.headers.get("Retry-After", "2")))
            raise RuntimeError(f"bulk create refused 30 times: {response.text}")

        await asyncio.gather(*(send(start) for start in range(0, count, BULK)))
        return sorted(accepted)

    async def service_counters(self) -> dict[str, float]:
        """Emits, and the lease round trips' histogram buckets, summed over the live services."""
        total: dict[str, float] = {}
        for proc in self.services:
            port = self.metrics_ports.get(proc.popen.pid)
            if port is None or proc.popen.poll() is not None:
                continue
            async with httpx.AsyncClient(timeout=30) as client:
                text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            for line in text.splitlines():
                if line.startswith(("orch_service_emits_total", "orch_service_lease_round_trip_seconds_bucket")):
                    name, value = line.rsplit(" ", 1)
                    total[name] = total.get(name, 0.0) + float(value)
        return total

    async def state_counters(self) -> dict[str, float]:
        """The state consumer's counters from the manager's /metrics: busy seconds per phase,
        batches, messages applied."""
        counters = {}
        for line in (await self.http.get("/metrics")).text.splitlines():
            if line.startswith(("orch_state_busy_seconds_total", "orch_state_batches_total", "orch_state_messages_")):
                name, value = line.rsplit(" ", 1)
                counters[name.removeprefix("orch_state_").replace('_total{phase="', ":").rstrip('"}')] = float(value)
        return counters

    def product_pids(self) -> set[int]:
        """This system's processes (their children are counted with them): the broker node,
        the PostgreSQL cluster, the manager and the services."""
        pids = {proc.popen.pid for proc in self.system.procs if proc.popen.poll() is None}
        return pids | {pid for pid in (self.rabbit.live_pid(), infra.postgres_node().live_pid()) if pid}

    def broker_kib(self) -> int:
        """Live memory after a collection of every process, not RSS (``bench.broker_memory``)."""
        return broker_memory_kib(self.rabbit)

    async def postgres_kib(self) -> int:
        assert self.db is not None
        return int(await self.db.fetchval("SELECT pg_database_size(current_database())")) // 1024

    # --- the point -------------------------------------------------------------------------

    async def run(self) -> None:
        watch = self.watch
        p, n = self.point, self.point.size
        kind, args = WORKLOADS[p.workload]
        step = "start"
        try:
            await self.start()
            assert self.db is not None
            killed = Killed()
            ledger = await open_ledger(self.system.procs, self.db, killed)
            await asyncio.sleep(2)
            services_before = sum(rss_kib(s.popen.pid) for s in self.services)
            broker_before, postgres_before = self.broker_kib(), await self.postgres_kib()

            step = "create"
            began = time.monotonic()
            await self.bulk_create(n, kind, args)
            p.create_rate = n / (time.monotonic() - began)
            await self.until(lambda: self._count_is("Processing", n), 3_600, f"{n:,} Processing")
            p.all_processing_s = time.monotonic() - began

            step = "memory"
            await asyncio.sleep(10)
            p.service_kib_per_observer = (sum(rss_kib(s.popen.pid) for s in self.services) - services_before) / n
            p.broker_kib_per_observer = (self.broker_kib() - broker_before) / n
            p.postgres_kib_per_observer = (await self.postgres_kib() - postgres_before) / n

            step = "steady"
            roots = self.product_pids()
            traced = broker_work.mark(self.rabbit)
            counters, cpu_before = await self.service_counters(), profile.cpu_seconds(roots)
            await asyncio.sleep(STEADY_S)
            p.steady_cpu_s = profile.cpu_delta(cpu_before, profile.cpu_seconds(roots))
            p.steady_broker_work = broker_work.since(self.rabbit, traced)
            p.steady_cpu_pct_of_core = 100 * sum(p.steady_cpu_s.values()) / STEADY_S
            after = await self.service_counters()
            during = {name: after[name] - counters.get(name, 0.0) for name in after}
            p.events_per_s = during.get("orch_service_emits_total", 0.0) / STEADY_S
            p.lease_round_trip_p99_s = _p99_bound(during)
            if self.profile_dir is not None:  # another quiet minute: py-spy's own cost stays out of the figures
                with self._profiled("steady", self.services):
                    await asyncio.sleep(STEADY_S)

            step = "api"
            p.api_p99_ms = await self.api_p99()

            step = "failover"
            await self.failover(killed)

            step = "stop"
            ids = [str(r[0]) for r in await self.db.fetch("SELECT id FROM observers WHERE status = 'Processing'")]
            stopping = random.sample(ids, n // 10)
            began = time.monotonic()
            for i in range(0, len(stopping), 10_000):
                (
                    await self.http.post("/api/observers/bulk-stop", json={"ids": stopping[i : i + 10_000]})
                ).raise_for_status()
            await self.until(lambda: self._count_is("Deleted", len(stopping)), 1_800, "the stopped ones Deleted")
            p.stop_count, p.stop_s = len(stopping), time.monotonic() - began

            deaths = await close_ledger(ledger, self.system.procs, self.db)
            p.false_deaths = {k: v for k, v in asdict(deaths).items() if k != "cut"}
            p.completed = True
        except Exception as e:  # noqa: BLE001 - recorded: the curve is the deliverable, not a pass
            p.stopped_at = f"{step}: {type(e).__name__}: {e}; {watch.diagnosis()}"
        finally:
            p.lowest_available_mib = watch.lowest_mib
            if self.db is not None:
                await self.db.close()
            await self.http.aclose()

    async def start(self) -> None:
        """The manager and three services, each with room for half the size (two must hold
        all after a kill), and a connection to the database."""
        await asyncio.to_thread(self.system.start_manager)
        for i in range(3):
            port = free_port()
            proc = await asyncio.to_thread(
                self.system.start_service, f"scale-{i}", self.point.size // 2 + 1_000, True, ORCH_METRICS_PORT=str(port)
            )
            self.services.append(proc)
            self.metrics_ports[proc.popen.pid] = port
        self.db = await asyncpg.connect(self.system.database_url.replace("+asyncpg", ""))

    async def _count_is(self, status: str, expected: int) -> bool:
        return await self.count(status) >= expected

    async def api_p99(self) -> dict[str, float]:
        assert self.db is not None
        ids = [str(r[0]) for r in await self.db.fetch("SELECT id FROM observers ORDER BY random() LIMIT 200")]
        calls: dict[str, Callable[[], Awaitable[httpx.Response]]] = {
            "list": lambda: self.http.get("/api/observers?status=Processing&limit=100"),
            "get": lambda: self.http.get(f"/api/observers/{random.choice(ids)}"),
            "stats": lambda: self.http.get("/api/stats"),
        }
        p99 = {}
        for name, call in calls.items():
            p99[name] = percentile(await latencies_ms(call, 200), 0.99)
        return p99

    async def failover(self, killed: Killed) -> None:
        assert self.db is not None
        row = await busiest_host(self.db)
        victim = next(s for s in self.services if s.popen.pid == row["pid"])
        killed.pids.add(victim.popen.pid)
        killed.service_ids.add(str(row["service_id"]))
        self.watch.killed_pids.add(victim.popen.pid)
        roots = self.product_pids()
        traced = broker_work.mark(self.rabbit)  # before the CPU is read: the mark's own cost stays out
        cpu_before, state_before = profile.cpu_seconds(roots), await self.state_counters()
        with self._profiled("failover", [s for s in self.services if s is not victim]):
            began = time.monotonic()
            victim.kill9()
            await self._moved_from(row["service_id"])
            self.point.failover_count, self.point.failover_s = int(row["n"]), time.monotonic() - began
        self.point.failover_cpu_s = profile.cpu_delta(cpu_before, profile.cpu_seconds(roots))
        self.point.failover_broker_work = broker_work.since(self.rabbit, traced)
        state_after = await self.state_counters()
        self.point.failover_state = {k: round(v - state_before.get(k, 0.0), 2) for k, v in state_after.items()}

    def _profiled(self, step: str, services: list[Proc]) -> contextlib.AbstractContextManager[None]:
        """py-spy on the manager (both processes) and ``services`` while the block runs, with
        ``--profile``."""
        if self.profile_dir is None:
            return contextlib.nullcontext()
        pids = {s.name: s.popen.pid for s in services}
        assert self.system.manager is not None
        pids["manager"] = self.system.manager.popen.pid
        pids |= profile.children(self.system.manager.popen.pid)
        return profile.profiled(self.profile_dir, f"{step}-{self.point.size}-{self.point.workload}", pids)

    async def _moved_from(self, service_id: Any) -> None:
        async def moved() -> bool:
            assert self.db is not None
            return await held_by(self.db, service_id) == 0 and await self._count_is("Processing", self.point.size)

        await self.until(moved, 1_800, "the killed service's share Processing elsewhere")


def measure(
    point: Point, rabbit: infra.RabbitNode, postgres: infra.PostgresNode, profile_dir: Path | None = None
) -> str:
    """Run one point on a vhost and database of its own; returns the folder of its logs."""
    tag = f"bench_scale_{int(time.time())}"
    system = fresh_system(rabbit, postgres, tag, f"orch-scale-{point.size}-{point.workload}-")
    system.env |= SCALE_ENV
    point.settings = dict(SCALE_ENV)
    try:
        asyncio.run(_observe(system, point, rabbit, profile_dir))
    finally:
        system.stop_all()
        _teardown(point, lambda: rabbit.delete_vhost(tag, timeout=3_600), lambda: postgres.drop_database(tag))
    if point.completed:
        # Last, on an empty broker of its own: its messages must not weigh on the product's
        # figures (memory above all), nor the product's on its.
        rabbit.add_vhost(f"{tag}_raw")
        try:
            raw = asyncio.run(arun_raw(rabbit.url_for(f"{tag}_raw"), point.size, 3, batched=False, rabbit=rabbit))
            point.raw_redelivery_count, point.raw_redelivery_s = raw.killed_held, raw.redelivery_s
            point.raw_redelivery_cpu_s = raw.redelivery_cpu_s
            point.raw_redelivery_broker_work = raw.redelivery_broker_work
        except Exception as e:  # noqa: BLE001 - recorded, as for the product
            point.stopped_at = f"raw: {type(e).__name__}: {e}"
        finally:
            _teardown(point, lambda: rabbit.delete_vhost(f"{tag}_raw", timeout=3_600))
    return str(system.workdir)


def _teardown(point: Point, *steps: Callable[[], None]) -> None:
    """Clean up after a point; a failure is noted on it, never loses what it measured."""
    for step in steps:
        try:
            step()
        except Exception as e:  # noqa: BLE001
            point.teardown_error += f"{type(e).__name__}: {e}; "


async def _observe(system: System, point: Point, rabbit: infra.RabbitNode, profile_dir: Path | None) -> None:
    watch = Watch(system.procs)
    watcher = asyncio.create_task(watch.run())
    try:
        await ScalePoint(system, point, rabbit, watch, profile_dir).run()
    finally:
        watcher.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="comma-separated sizes")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"of {', '.join(WORKLOADS)}")
    parser.add_argument(
        "--profile", action="store_true", help="record py-spy profiles of the manager and the survivors during failover"
    )
    parser.add_argument("--from", dest="saved", nargs="+", help="draw the table and the curve of saved results")
    args = parser.parse_args(argv)
    if args.saved:
        saved = [Point(**p) for path in args.saved for p in json.loads(Path(path).read_text())["points"]]
        print(curve.table(saved))
        print(f"curve written to {curve.draw(saved, Path(args.saved[-1]).with_suffix('.png'))}")
        return 0
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if unknown := set(workloads) - set(WORKLOADS):
        parser.error(f"unknown workload(s): {', '.join(sorted(unknown))}")
    if args.profile and not profile.available():
        parser.error("--profile needs py-spy on PATH (pip install py-spy)")
    infra.up()
    rabbit, postgres = infra.rabbit_node(), infra.postgres_node()
    started = datetime.now(UTC)
    out = results_path("scale", started)
    profile_dir = RESULTS / f"profile-{stamp(started)}" if args.profile else None
    points: list[Point] = []
    logs: dict[str, str] = {}
    for workload in workloads:
        for size in sizes:
            point = Point(size, workload)
            print(f"scale: {size:,} {workload} ...", flush=True)
            logs[f"{size} {workload}"] = measure(point, rabbit, postgres, profile_dir)
            points.append(point)
            print(curve.row(point), flush=True)
            # Written after every point: a long run that is stopped keeps what it measured.
            out.write_text(
                json.dumps(
                    {"started": started.isoformat(), "points": [asdict(p) for p in points], "logs": logs}, indent=2
                )
            )
    print(curve.table(points))
    png = curve.draw(points, out.with_suffix(".png"))
    print(f"\nresults written to {out} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
