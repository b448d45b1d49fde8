"""``python -m bench.create_burst``: what the balancer does while a bulk create lands.

On one node, three services of N workers each, the balancer on at its default pace; N idle
observers created in bulk requests of 1,000 (eight at a time) until all are Processing, then
``--settle`` seconds more. Per run: the create rate, the hand-overs the balancer asked for
during the create and after it (``orch_handovers_total``), the consumers the services opened
again meanwhile (each a new placement), and what each service runs at the end. An even
burst should move nothing: the broker deals it round-robin (docs/design.md, "Starts in
flight").

    python -m bench.create_burst                  # N = 100,000, 3 runs
    python -m bench.create_burst --size 30000 --runs 5

Prints one line per run and writes ``bench/results/create-burst-<time>.json``. No target:
every hand-over here restarts an observer that ran fine, so the figure to read is 0.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from bench.cluster import create, handovers, start_consumes
from bench.fresh import fresh_system
from bench.results_file import results_path, write_results
from bench.scale import SCALE_ENV
from tools import infra
from tools.harness import free_port


def one_run(size: int, settle_s: float) -> dict[str, Any]:
    infra.up()
    rabbit, postgres = infra.rabbit_node(), infra.postgres_node()
    tag = f"bench_burst_{time.time_ns()}"
    system = fresh_system(rabbit, postgres, tag, "orch-burst-")
    system.env |= SCALE_ENV | {"ORCH_BALANCE_MOVES_PER_S": "250"}
    try:
        system.start_manager()
        ports = {f"svc-{i}": free_port() for i in range(3)}
        for name, port in ports.items():
            system.start_service(name, size, True, ORCH_METRICS_PORT=str(port))
        consumes, asked = asyncio.run(start_consumes(ports)), asyncio.run(handovers(system))
        rate = asyncio.run(create(system, size))
        during = (asyncio.run(start_consumes(ports)) - consumes, asyncio.run(handovers(system)) - asked)
        time.sleep(settle_s)
        after = (asyncio.run(start_consumes(ports)) - consumes, asyncio.run(handovers(system)) - asked)
        return {
            "create_per_s": rate,
            "consumes_during": int(during[0]),
            "handovers_during": int(during[1]),
            "consumes_in_all": int(after[0]),
            "handovers_in_all": int(after[1]),
            "running": sorted(s["running"] for s in system.services() if s["status"] == "alive"),
        }
    finally:
        system.stop_all()
        # Its N starts wait in the vhost's queue: left there, every later boot of the node
        # would recover them (the tests' broker took over 90 s after twenty such runs).
        rabbit.delete_vhost(tag, timeout=600)
        postgres.drop_database(tag)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--settle", type=float, default=8.0, help="seconds watched after the create")
    args = parser.parse_args(argv)
    started = datetime.now(UTC)
    out = results_path("create-burst", started)
    document: dict[str, Any] = {"started": started.isoformat(), "size": args.size, "runs": []}
    for i in range(args.runs):
        run = one_run(args.size, args.settle)
        document["runs"].append(run)
        write_results(out, document)
        print(
            f"run {i + 1}: create {run['create_per_s']:,.0f}/s; hand-overs asked {run['handovers_during']:,} during, "
            f"{run['handovers_in_all']:,} in all; consumed again {run['consumes_in_all']:,}; "
            f"each runs {run['running']}",
            flush=True,
        )
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
