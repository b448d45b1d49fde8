"""``python -m bench.traces`` (``make bench-traces``; ``make bench`` runs it too): what traces
cost (issue 63, item 3), off and on alternated in one run.

For each round, and in each round each mode, on a vhost and a database of their own: a manager
and three services, then N idle observers created in bulk requests until all are Processing
(observers/s). The modes:
* ``off``: ``OTEL_EXPORTER_OTLP_ENDPOINT`` unset (nothing of OpenTelemetry loaded);
* ``ratio``: on, at the documented sampling, ``parentbased_traceidratio`` with 0.01 (``--ratio``);
* ``always_on``: on, every span sampled and exported.
``--profile`` profiles the processes of the always_on rounds (``--profile ratio,always_on``:
of those modes; ``bench/profile.py``), which costs a few per cent: a profiled run's figures
are not the ones to quote.
Each run also says the CPU seconds the manager's and the services' processes used during the
create (``bench/profile.py``): on a machine shared with other work, where the rate moves with
the load, the CPU ratio is the steadier figure. The spans go to the tiny receiver of the
tests (``tools/otlp_receiver.py``), in this process, counting them. Target: ``ratio`` at most
5 % slower than ``off``; ``always_on`` is reported.

    python -m bench.traces                    # N = 30,000, 2 rounds
    python -m bench.traces --ratio 0.1        # another sampling in the ratio mode
    python -m bench.traces --n 3000 --rounds 1

Prints the columns and ratios next to the target and writes ``bench/results/traces-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import profile
from bench.cluster import create
from bench.fresh import fresh_system
from bench.results_file import RESULTS, results_path, stamp, write_results
from bench.run import aligned
from bench.scale import SCALE_ENV
from tools import infra
from tools.harness import Proc
from tools.otlp_receiver import OtlpReceiver

MODES = {
    "off": {},
    "ratio": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio"},  # its ratio: --ratio
    "always_on": {"OTEL_TRACES_SAMPLER": "parentbased_always_on"},
}
TARGET = 1.05  # ratio: at most 5 % slower than off


def run_mode(mode: str, n: int, receiver: OtlpReceiver, profile_dir: Path | None) -> dict[str, float]:
    rabbit, postgres = infra.rabbit_node(), infra.postgres_node()
    tag = f"bench_traces_{mode}_{int(time.time())}"
    system = fresh_system(rabbit, postgres, tag, f"orch-bench-traces-{mode}-")
    system.env |= SCALE_ENV
    if MODES[mode]:
        system.env |= {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            **MODES[mode],
        }
    before = receiver.count
    try:
        system.start_manager()
        services = [system.start_service(f"svc-{i}", n) for i in range(3)]
        assert system.manager is not None
        roots = {system.manager.popen.pid} | {p.popen.pid for p in services}
        cpu_before = profile.cpu_seconds(roots)
        if profile_dir is not None:
            pids = {"manager": system.manager.popen.pid} | profile.children(system.manager.popen.pid)
            pids |= {p.name: p.popen.pid for p in services}
            with profile.profiled(profile_dir, f"create-{mode}", pids):
                per_s = asyncio.run(create(system, n))
        else:
            per_s = asyncio.run(create(system, n))
        cpu = profile.cpu_delta(cpu_before, profile.cpu_seconds(roots))
        if MODES[mode]:
            stop_flushing(system.procs)
    finally:
        system.stop_all()
        rabbit.delete_vhost(tag, timeout=600)
        postgres.drop_database(tag)
    spans = receiver.count - before
    cpu_s = sum(cpu.values())
    load = os.getloadavg()[0]
    print(
        f"  {mode}: create {per_s:,.0f}/s, {cpu_s:.1f} CPU s of the manager and services {cpu}, "
        f"{spans:,} span(s) exported, load {load:.1f}",
        flush=True,
    )
    return {"create_per_s": per_s, "cpu_s": cpu_s, "spans": spans, "load_1m": load}


def stop_flushing(procs: list[Proc]) -> None:
    """SIGTERM to all at once (each exports what its batch processor holds as it stops);
    whatever is still running a minute later is killed by ``stop_all``."""
    for proc in procs:
        if proc.alive():
            proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(max(0.1, deadline - time.monotonic()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=30_000, help="observers created per mode and round")
    parser.add_argument("--rounds", type=int, default=2, help="off, ratio, always_on: this many times")
    parser.add_argument(
        "--ratio", type=float, default=0.01, help="the ratio mode's parentbased_traceidratio (documented: 0.01)"
    )
    parser.add_argument(
        "--profile",
        nargs="?",
        const="always_on",
        default="",
        help="profile the rounds of these modes (comma-separated; alone: always_on) with py-spy",
    )
    args = parser.parse_args(argv)
    MODES["ratio"]["OTEL_TRACES_SAMPLER_ARG"] = str(args.ratio)
    if args.profile and not profile.available():
        parser.error("--profile needs py-spy (make venv installs it)")

    infra.up()
    started = datetime.now(UTC)
    profile_dir = RESULTS / f"profile-traces-{stamp(started)}" if args.profile else None
    profiled = set(args.profile.split(",")) - {""}
    if profiled - set(MODES):
        parser.error(f"--profile takes modes among {', '.join(MODES)}")
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with OtlpReceiver(keep=False) as receiver:
        for round_no in range(args.rounds):
            print(f"round {round_no + 1} of {args.rounds}", flush=True)
            for mode in MODES:
                runs[mode].append(run_mode(mode, args.n, receiver, profile_dir if mode in profiled else None))

    off = statistics.median(r["create_per_s"] for r in runs["off"])
    off_cpu = statistics.median(r["cpu_s"] for r in runs["off"])
    rows = [("mode (median of rounds)", "create (observers/s)", "spans", "time / off", "CPU / off", "target")]
    verdicts = {}
    for mode in MODES:
        per_s = statistics.median(r["create_per_s"] for r in runs[mode])
        slower = off / per_s  # the time a create takes, relative to off
        target = f"<= {TARGET:.2f}" if mode == "ratio" else ""
        if mode == "ratio":
            verdicts[mode] = slower <= TARGET
            target += " (met)" if verdicts[mode] else " (MISSED)"
        spans = statistics.median(r["spans"] for r in runs[mode])
        cpu = statistics.median(r["cpu_s"] for r in runs[mode]) / off_cpu
        rows.append((mode, f"{per_s:,.0f}", f"{spans:,.0f}", f"{slower:.3f}", f"{cpu:.3f}", target))
    print(f"\nN = {args.n:,}, {args.rounds} round(s), ratio {args.ratio:g}, modes alternated in each\n" + aligned(rows))
    out = results_path("traces", started)
    document = {
        "started": started.isoformat(),
        "n": args.n,
        "ratio": args.ratio,
        "target": TARGET,
        "runs": runs,
        "met": verdicts,
    }
    write_results(out, document)
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
