"""The benchmark on each supported RabbitMQ, side by side: what the broker version costs.

    python -m bench.versions                        # 4.3 and 3.10, N = 30,000 (make bench-versions)
    python -m bench.versions --series 4.3,4.0,3.10 --n 10000

Runs ``bench.run --only create,failover,stop`` once per series, each in a process of its own
with ``ORCH_RABBITMQ`` set (``tools.infra`` stops the other series' node and starts that one),
then prints every figure with one column per series and writes them, with each run's own
results file, to ``bench/results/versions-<UTC time>.json``. The figures: the raw broker's
hold and redelivery rates, create, density, the broker's memory per held start
(``bench.broker_memory``), failover and stop.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.figures import Figure
from bench.results_file import RESULTS, results_path, write_results
from bench.run import aligned
from tools.infra.brokers import RELEASES, SERIES_ENV_VAR

SCENARIOS = "create,failover,stop"


def run_series(series: str, n: int) -> Path:
    """``bench.run`` on ``series``; the results file it wrote."""
    began = time.time()
    env = os.environ | {SERIES_ENV_VAR: series}
    argv = [sys.executable, "-m", "bench.run", "--only", SCENARIOS, "--n", str(n)]
    print(f"== RabbitMQ {series}: {' '.join(argv[1:])}", flush=True)
    subprocess.run(argv, env=env, check=True)
    written = [p for p in RESULTS.glob("2*.json") if p.stat().st_mtime >= began]
    if not written:
        raise SystemExit(f"bench.run on RabbitMQ {series} wrote no results file")
    return max(written, key=lambda p: p.stat().st_mtime)


def side_by_side(runs: dict[str, dict[str, Any]]) -> str:
    """One row per figure, one column per series (the broker's exact version heads it)."""
    order: list[tuple[str, str]] = []
    values: dict[tuple[str, str], dict[str, str]] = {}
    for series, run in runs.items():
        for f in run["figures"]:
            key = (f["scenario"], f["name"])
            if key not in values:
                order.append(key)
                values[key] = {}
            shown = Figure(f["scenario"], f["name"], f["value"], f["unit"], decimals=f.get("decimals")).shown()
            values[key][series] = shown
    heads = [f"{series} ({run['machine']['rabbitmq']})" for series, run in runs.items()]
    rows: list[tuple[str, ...]] = [("scenario", "figure", *heads)]
    rows += [(s, name, *(values[s, name].get(series, "-") for series in runs)) for s, name in order]
    return aligned(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--series", default="4.3,3.10", help=f"comma-separated, of {', '.join(RELEASES)}")
    parser.add_argument("--n", type=int, default=30_000, help="observers for create/failover/stop")
    args = parser.parse_args(argv)
    series = [s.strip() for s in args.series.split(",") if s.strip()]
    if unknown := [s for s in series if s not in RELEASES]:
        parser.error(f"unknown series: {', '.join(unknown)}")
    started = datetime.now(UTC)
    files = {s: run_series(s, args.n) for s in series}
    runs = {s: json.loads(path.read_text()) for s, path in files.items()}
    print()
    print(side_by_side(runs))
    out = results_path("versions", started)
    with_files = {s: {"file": files[s].name} | runs[s] for s in runs}
    document = {"started": started.isoformat(), "n": args.n, "runs": with_files}
    write_results(out, document)
    print(f"\nresults written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
