"""The create rate up to 1,000,000 on each broker series, side by side (issue 65, part 3): is it
flat, and where does a series spend more?

    python -m bench.create_curve                              # 4.3 and 3.10, 1,000,000 idle
    python -m bench.create_curve --series 4.3 --n 300000
    python -m bench.create_curve --series 4.3 --queue-types classic,quorum
    python -m bench.create_curve --series 4.3 --start-queues 1,3     # ORCH_START_QUEUES

Per series and queue type (``ORCH_QUEUE_TYPE``; classic, the one node's default, unless
asked), in a process of its own (``ORCH_RABBITMQ``: ``tools.infra`` starts that node), as
``bench.scale`` sets it up (a fresh vhost and database, the manager and three services at the
product's defaults), N idle observers are created in bulk (8 requests of 1,000 in flight), and:

* the accepted rate over each tenth of N: flat, or falling as the start queue grows;
* the time until all are Processing;
* CPU seconds per part (broker, PostgreSQL, manager, services) over the create;
* the broker's work over the create (``bench/broker_work.py``): reductions per kind of
  process, its threads' busy seconds per state, the start queue's collections.

Results: ``bench/results/create-curve-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import broker_work, profile
from bench.curve import Point
from bench.fresh import fresh_system
from bench.results_file import results_path, write_results
from bench.run import aligned, machine
from bench.scale import SCALE_ENV, ScalePoint, Watch, _teardown
from shared import topology
from tools import infra
from tools.infra.brokers import RELEASES, SERIES_ENV_VAR

TENTHS = 10


def rate_by_tenth(began: float, accepted: list[float], per_request: int) -> list[float]:
    """Observers accepted per second over each tenth of the requests (``accepted``: when each
    request was, in order)."""
    rates, start, last = [], began, 0
    for k in range(1, TENTHS + 1):
        end_index = len(accepted) * k // TENTHS
        if end_index <= last:
            continue
        end = accepted[end_index - 1]
        rates.append(round((end_index - last) * per_request / max(end - start, 1e-9), 1))
        start, last = end, end_index
    return rates


async def _measure(n: int, queue_type: str, start_queues: int) -> dict[str, Any]:
    rabbit, postgres = infra.rabbit_node(), infra.postgres_node()
    tag = f"bench_create_{int(time.time())}"
    system = fresh_system(rabbit, postgres, tag, f"orch-create-{n}-")
    system.env |= SCALE_ENV | {"ORCH_QUEUE_TYPE": queue_type, "ORCH_START_QUEUES": str(start_queues)}
    point = Point(n, "idle", settings=dict(SCALE_ENV))
    result: dict[str, Any] = {
        "n": n,
        "queue_type": queue_type,
        "start_queues": start_queues,
        "machine": machine(),
        "logs": str(system.workdir),
    }
    scale = ScalePoint(system, point, rabbit, Watch(system.procs))
    try:
        await scale.start()
        await asyncio.sleep(2)
        roots = scale.product_pids()
        # The first start queue (of several, each holds about its share): it grows meanwhile
        traced = broker_work.mark(rabbit, (tag, topology.start_queue_name("default", 0)))
        cpu_before = profile.cpu_seconds(roots)
        began = time.monotonic()
        accepted = await scale.bulk_create(n, "idle", {})
        result["create_rate"] = round(n / (time.monotonic() - began), 1)
        result["rate_by_tenth"] = rate_by_tenth(began, accepted, 1_000)
        await scale.until(lambda: scale._count_is("Processing", n), 3_600, f"{n:,} Processing")
        result["all_processing_s"] = round(time.monotonic() - began, 1)
        result["cpu_s"] = profile.cpu_delta(cpu_before, profile.cpu_seconds(roots))
        result["broker_work"] = broker_work.since(rabbit, traced)
    finally:
        if scale.db is not None:
            await scale.db.close()
        await scale.http.aclose()
        system.stop_all()
        _teardown(point, lambda: rabbit.delete_vhost(tag, timeout=3_600), lambda: postgres.drop_database(tag))
    return result


def run_series(series: str, queue_type: str, start_queues: int, n: int, out: Path) -> dict[str, Any]:
    env = os.environ | {SERIES_ENV_VAR: series}
    print(f"== RabbitMQ {series}, {queue_type} queues x{start_queues}: {n:,} idle observers created", flush=True)
    child = [sys.executable, "-m", "bench.create_curve", "--n", str(n), "--queue-types", queue_type]
    child += ["--start-queues", str(start_queues), "--one", str(out)]
    subprocess.run(child, env=env, check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    return result


def side_by_side(runs: dict[str, dict[str, Any]]) -> str:
    heads = [f"{name} ({run['machine']['rabbitmq']})" for name, run in runs.items()]
    rows: list[tuple[str, ...]] = [("figure", *heads)]
    rows.append(("accepted /s", *(f"{r['create_rate']:,.0f}" for r in runs.values())))
    for k in range(TENTHS):
        rows.append((f"  accepted /s, tenth {k + 1}", *(_at(r["rate_by_tenth"], k) for r in runs.values())))
    rows.append(("all Processing s", *(f"{r['all_processing_s']:,.1f}" for r in runs.values())))
    parts = sorted({part for r in runs.values() for part in r["cpu_s"]})
    rows += [(f"CPU s: {part}", *(f"{r['cpu_s'].get(part, 0):,.1f}" for r in runs.values())) for part in parts]
    top = [{w["process"]: w for w in r["broker_work"] if "reductions" in w} for r in runs.values()]
    kinds = sorted({kind for works in top for kind in works})
    rows += [(f"reductions M: {kind}", *(_reductions(works.get(kind)) for works in top)) for kind in kinds]
    # The rest: all collections, thread states, the largest heap's collections (another kind
    # of process may hold it on each series, so each is said by name)
    other = [
        {f"{w['process']}: {key}": value for w in r["broker_work"] if "reductions" not in w for key, value in w.items()}
        for r in runs.values()
    ]
    names = sorted({name for figures in other for name in figures if not name.endswith(": process")})
    rows += [(name, *(str(figures.get(name, "-")) for figures in other)) for name in names]
    return aligned(rows)


def _at(values: list[float], k: int) -> str:
    return f"{values[k]:,.0f}" if k < len(values) else "-"


def _reductions(work: dict[str, Any] | None) -> str:
    return "-" if work is None else f"{work['reductions'] / 1e6:,.1f} ({work['max_heap_mib']} MiB)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", default="4.3,3.10", help=f"comma-separated, of {', '.join(RELEASES)}")
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--queue-types", default="classic", help="comma-separated, of classic and quorum")
    parser.add_argument("--start-queues", default="1", help="comma-separated: start queues per pool to try")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # a child: this series only, into this file
    args = parser.parse_args(argv)
    if args.one is not None:
        infra.up()
        result = asyncio.run(_measure(args.n, args.queue_types, int(args.start_queues)))
        write_results(args.one, result)
        return 0
    started = datetime.now(UTC)
    out = results_path("create-curve", started)
    runs: dict[str, dict[str, Any]] = {}
    types = [t.strip() for t in args.queue_types.split(",") if t.strip()]
    layouts = [int(k) for k in args.start_queues.split(",") if k.strip()]
    for series in (s.strip() for s in args.series.split(",") if s.strip()):
        for queue_type in types:
            for k in layouts:
                name = series + ("" if types == ["classic"] else f" {queue_type}") + ("" if k == 1 else f" x{k}")
                part = out.with_suffix(f".{series}.{queue_type}.{k}.part")
                runs[name] = run_series(series, queue_type, k, args.n, part)
                write_results(out, {"started": started.isoformat(), "n": args.n, "runs": runs})
    print(side_by_side(runs))
    print(f"\nresults written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
