"""The benchmark: the product against the raw broker limit, in one run.

    python -m bench.run            # N = 30,000, scale = 100,000   (make bench)
    python -m bench.run --quick    # N = 2,000,  scale = 5,000     (make bench-quick; CI)

Starts the project's RabbitMQ and PostgreSQL (tools.infra), a private vhost and database,
a manager and three observer services as real processes, runs each scenario, prints figure,
target, ratio and verdict side by side, and writes everything to bench/results/. It never
fails because a target was missed: it reports. Scenarios and targets: see ``SCENARIOS`` in
bench/scenarios.py and docs/benchmarks.md's results table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import profile
from bench.figures import Figure
from bench.fresh import fresh_system
from bench.results_file import RESULTS, stamp
from bench.scenarios import NEEDS_CREATE, SCENARIOS, Bench
from tools import infra


def machine() -> dict[str, Any]:
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line)
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "rabbitmq": infra.rabbit_node().ctl("-q", "eval", "rabbit_misc:version().").strip().strip('"'),
    }


def warn_about_leftovers(rabbit: infra.RabbitNode, postgres: infra.PostgresNode) -> None:
    """A failed run keeps its vhost and database for inspection; left there, their messages
    and rows slow every later run on the same broker (fifteen of them did, once)."""
    vhosts = [v for v in rabbit.ctl("-q", "list_vhosts").split() if v.startswith("bench_")]
    databases = postgres.psql(r"SELECT datname FROM pg_database WHERE datname LIKE 'bench\_%';").split()
    if vhosts or databases:
        print(
            f"WARNING: {len(vhosts)} vhost(s) and {len(databases)} database(s) of earlier failed runs remain and "
            f"slow this one: {', '.join(sorted(set(vhosts) | set(databases)))}; delete them with "
            "`rabbitmqctl delete_vhost NAME` and `DROP DATABASE NAME`",
            file=sys.stderr,
            flush=True,
        )


def table(figures: list[Figure]) -> str:
    rows = [("scenario", "figure", "value", "target", "ratio", "verdict")]
    for f in figures:
        rows.append((f.scenario, f.name, f.shown(), f.target_text, f.ratio_text(), f.verdict()))
    return aligned(rows)


def aligned(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` (the first is the heading) as text columns, a rule under the heading."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small N, for CI and smoke runs")
    parser.add_argument("--n", type=int, help="observers for create/failover/stop (default 30,000; quick 2,000)")
    parser.add_argument("--scale", type=int, help="observers held for the API latency scenario (100,000; quick 5,000)")
    parser.add_argument(
        "--only",
        help=f"comma-separated scenarios to run (of {', '.join(SCENARIOS)}); raw always runs, and create "
        "runs too for those that need its observers",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="record py-spy profiles of the manager and services during each scenario (figures not comparable)",
    )
    args = parser.parse_args(argv)
    only = None
    if args.only:
        only = {s.strip() for s in args.only.split(",") if s.strip()}
        unknown = only - set(SCENARIOS)
        if unknown:
            parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
        if only & NEEDS_CREATE:
            only.add("create")
    if args.profile and not profile.available():
        parser.error("--profile needs py-spy on PATH (pip install py-spy)")
    n = args.n or (2_000 if args.quick else 30_000)
    scale = args.scale or (5_000 if args.quick else 100_000)

    infra.up()
    rabbit, postgres = infra.rabbit_node(), infra.postgres_node()
    warn_about_leftovers(rabbit, postgres)
    tag = f"bench_{int(time.time())}"
    system = fresh_system(rabbit, postgres, tag, "orch-bench-")
    workdir = system.workdir
    started = datetime.now(UTC)
    try:
        profile_dir = RESULTS / f"profile-{stamp(started)}" if args.profile else None
        bench = Bench(system, n=n, scale=scale, quick=args.quick, only=only, profile_dir=profile_dir)
        figures = asyncio.run(bench.run_all())
    except BaseException:
        print(f"benchmark failed; database {tag!r} and vhost kept for inspection, logs in {workdir}", file=sys.stderr)
        system.stop_all()
        raise
    system.stop_all()
    rabbit.delete_vhost(tag)
    postgres.drop_database(tag)
    print(table(figures))
    for figure in figures:
        if figure.note:
            print(f"  {figure.scenario} / {figure.name}: {figure.note}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{stamp(started)}{'-quick' if args.quick else ''}.json"
    out.write_text(
        json.dumps(
            {
                "started": started.isoformat(),
                "n": n,
                "scale": scale,
                "quick": args.quick,
                "only": sorted(only) if only else None,
                "profiled": args.profile,
                "machine": machine(),
                "figures": [f.as_dict() for f in figures],
                "cpu_seconds": bench.cpu,
                "logs": str(workdir),
            },
            indent=2,
        )
    )
    print(f"\nresults written to {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")
    print(f"process logs in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
