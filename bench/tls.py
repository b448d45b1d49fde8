"""``python -m bench.tls`` (``make bench-tls``; ``make bench`` runs it too): what TLS on the
broker's and the database's connections costs, measured with it off and on in one run
(issue 63, item 1).

One RabbitMQ node with a plain and a TLS listener (mutual TLS), one PostgreSQL that takes both
(TLS with a client certificate, plain with a password), certificates by ``tools/pki.py``. For
each round, plain then TLS, on a vhost and a database of their own: a manager and three
services, then
* ``create``: N idle observers in bulk requests, until all are Processing (observers/s);
* ``failover``: ``kill -9`` of the busiest service, until its share is Processing on the
  others (seconds).
With TLS every connection of the manager and the services verifies the servers (the settings
of ``Pki.env``); the API stays plain HTTP, and the benchmark's own polls of the database are
plain in both (they are not what is measured).

    python -m bench.tls                 # N = 10,000, 2 rounds
    python -m bench.tls --n 2000 --rounds 1

Prints both columns and their ratio and writes ``bench/results/tls-<time>.json``. No targets:
TLS is judged against plain.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.cluster import create, service_kill
from bench.fresh import fresh_system
from bench.results_file import results_path, write_results
from bench.run import aligned
from bench.scale import SCALE_ENV
from tools import infra
from tools.pki import Pki, make_pki, tls_nodes

MODES = ("plain", "tls")


def run_mode(rabbit: infra.RabbitNode, postgres: infra.PostgresNode, pki: Pki, mode: str, n: int) -> dict[str, float]:
    tag = f"bench_tls_{mode}_{int(time.time())}"
    system = fresh_system(rabbit, postgres, tag, f"orch-bench-tls-{mode}-")
    system.env |= SCALE_ENV
    if mode == "tls":
        system.amqp_url = rabbit.tls_url_for(tag)
        system.env |= pki.env()
    try:
        system.start_manager()
        services = [system.start_service(f"svc-{i}", n) for i in range(3)]
        per_s = asyncio.run(create(system, n))
        seconds, moved = asyncio.run(service_kill(system, services, {}, n))
    finally:
        system.stop_all()
        rabbit.delete_vhost(tag, timeout=600)
        postgres.drop_database(tag)
    print(f"  {mode}: create {per_s:,.0f}/s, failover {seconds:.2f} s ({moved:,} moved)", flush=True)
    return {"create_per_s": per_s, "failover_s": seconds, "moved": moved}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000, help="observers created, then moved by a failover")
    parser.add_argument("--rounds", type=int, default=2, help="plain then TLS, this many times")
    args = parser.parse_args(argv)

    infra.up()  # the packages and the series's install; this benchmark runs nodes of its own
    base = Path(tempfile.mkdtemp(prefix="orch-bench-tls-"))
    pki = make_pki(base / "pki")
    rabbit, postgres = tls_nodes(base, pki, tls_only=False)
    started = datetime.now(UTC)
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    try:
        rabbit.start()
        postgres.start()
        for round_no in range(args.rounds):
            print(f"round {round_no + 1} of {args.rounds}", flush=True)
            for mode in MODES:
                runs[mode].append(run_mode(rabbit, postgres, pki, mode, args.n))
    finally:
        rabbit.destroy()
        postgres.destroy()

    rows = [("figure (median of rounds)", "plain", "tls", "tls / plain")]
    for key, label, fmt in (
        ("create_per_s", "create (observers/s)", "{:,.0f}"),
        ("failover_s", "failover (s)", "{:.2f}"),
    ):
        plain = statistics.median(r[key] for r in runs["plain"])
        tls = statistics.median(r[key] for r in runs["tls"])
        rows.append((label, fmt.format(plain), fmt.format(tls), f"{tls / plain:.2f}"))
    print(f"\nN = {args.n:,}, {args.rounds} round(s)\n" + aligned(rows))
    out = results_path("tls", started)
    write_results(out, {"started": started.isoformat(), "n": args.n, "runs": runs})
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
