"""``python -m bench.pod_sizing``: the figures behind ``deploy/kubernetes/observer-service.yaml``'s
memory request and termination grace period, for a service of W workers.

A manager and two services of W workers each; then W idle observers created, so that the first
service holds about half of them. Reported: the service's resident memory before and after (its
baseline, and per observer), and how long it takes from SIGTERM to its exit while it hands its
observers over (the grace period must cover it, or Kubernetes kills it half-way and the rest
move only when the broker notices the closed connection). Written to
``bench/results/pod-sizing-<time>.json``.

    python -m bench.pod_sizing            # W = 1,000
    python -m bench.pod_sizing --workers 5000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from bench.cluster import all_processing
from bench.fresh import create_idle, fresh_system
from bench.results_file import results_path, write_results
from bench.scale import SCALE_ENV
from tools import infra


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def create_all(base_url: str, database_url: str, count: int) -> None:
    db = await asyncpg.connect(database_url.replace("+asyncpg", ""))
    try:
        await create_idle(base_url, count, "p-", 1000)
        await all_processing(db, count)
    finally:
        await db.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1000, help="workers of each service (ORCH_WORKERS_COUNT)")
    args = parser.parse_args(argv)
    infra.up()
    rabbit, postgres = infra.rabbit_node(), infra.postgres_node()
    tag = f"bench_pod_{int(time.time())}"
    system = fresh_system(rabbit, postgres, tag, "orch-bench-pod-")
    system.env |= SCALE_ENV
    started = datetime.now(UTC)
    try:
        system.start_manager()
        measured = system.start_service("svc-0", args.workers)
        system.start_service("svc-1", args.workers)
        time.sleep(5)  # settled: imports done, first heartbeats and inventories sent
        baseline = rss_mib(measured.popen.pid)
        asyncio.run(create_all(system.base_url, system.database_url, args.workers))
        time.sleep(5)
        held = next(s["running"] for s in system.services() if s["name"] == "svc-0")
        loaded = rss_mib(measured.popen.pid)
        began = time.monotonic()
        code = measured.terminate(timeout=600)
        sigterm_s = time.monotonic() - began
    finally:
        system.stop_all()
        rabbit.delete_vhost(tag, timeout=600)
        postgres.drop_database(tag)
    figures = {
        "workers": args.workers,
        "observers_held": held,
        "rss_baseline_mib": round(baseline, 1),
        "rss_loaded_mib": round(loaded, 1),
        "kib_per_observer": round((loaded - baseline) * 1024 / max(held, 1), 2),
        "sigterm_to_exit_s": round(sigterm_s, 2),
        "exit_status": code,
    }
    for key, value in figures.items():
        print(f"{key:<20} {value}")
    out = results_path("pod-sizing", started)
    write_results(out, {"started": started.isoformat(), **figures})
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
