"""``python -m bench.state_apply``: what applying a failover's start reports costs per moved
row, in the state process and in PostgreSQL (issue 17).

Why alone: the state consumer applies reports one transaction at a time, its own Python
(claiming the message ids, locking and loading the rows, the rules, the writes) and then
PostgreSQL's work on them, one after the other. A failover is not over before that path has
been through every moved row, whatever else the cores are free for: sampled during `make
bench`'s failover (a scratch sampler of /proc/stat), the machine ran on both cores while the
survivors started their share and on about one near the end, while the state process and
PostgreSQL worked through the reports left. The figures here say how long that path is per
row, without the broker, the services or the API competing for the cores.

Method: a database of its own on the project's PostgreSQL (``tools.infra``), migrated; four
services born through the consumer (``ServiceBorn``); ``3 x n`` observers Processing on
three of them. Each run moves the ``n`` observers of one host to another with
``ObserversStarted`` messages (redelivered, as in a failover) of ``--per-message`` ids,
``--messages`` per transaction, through ``StateConsumer._transaction``, the consumer's own
transaction, in the order a failover's reports come (random ids). Runs alternate the
direction (A to D, then D back to A), so each one moves rows the previous one wrote.

Reported per run and as the median: microseconds per moved row of wall time, of the
process's CPU (the state process's share) and of PostgreSQL's CPU (every process of the
cluster: backends, WAL writer). No targets: this explains the failover's figure in
``make bench``, it does not replace it.

Since migration 0011 a moved row is updated in place (no index of ``observers`` covers a
column a move changes) and its host is mirrored in ``observer_hosts`` by triggers; the
``--without-host-indexes`` what-if that measured that change before it is gone with it.

    python -m bench.state_apply [--n 10000] [--runs 5] [--per-message 100] [--messages 7]

Results: ``bench/results/state-apply-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import asyncpg
import uvloop

from bench import profile
from bench.fresh import ON_HOST, fresh_system
from bench.results_file import results_path, write_results
from manager.db.engine import make_engine, make_sessionmaker
from manager.state.consumer import StateConsumer
from manager.state.probation import ProbationPolicy
from manager.state.rules import StateRules
from shared.messages import ObserversStarted, ServiceBorn
from tools import infra


@dataclass
class Run:
    rows: int
    wall_us: float  # per moved row
    process_cpu_us: float
    postgres_cpu_us: float
    transactions: int


def born(name: str) -> ServiceBorn:
    return ServiceBorn(
        service_id=uuid.uuid4(),
        name=name,
        workers_count=1_000_000,
        pools=["default"],
        kinds=["ticker"],
        host="bench",
        pid=0,
        version="bench",
    )


async def seed(db: asyncpg.Connection, hosts: list[ServiceBorn], n: int) -> list[uuid.UUID]:
    """``n`` Processing observers on each of ``hosts``; the first host's ids."""
    first: list[uuid.UUID] = []
    for host in hosts:
        ids = [uuid.uuid4() for _ in range(n)]
        first = first or ids
        await db.execute(
            "INSERT INTO observers (id, name, kind, args, status, service_id, host_session_id, attempts) "
            "SELECT id, 'obs-' || id, 'ticker', '{\"interval_s\": 3600, \"emit\": false}', 'Processing', $2, $3, 1 "
            "FROM unnest($1::uuid[]) AS id",
            ids,
            host.service_id,
            uuid.uuid4(),
        )
    await db.execute("VACUUM ANALYZE observers")
    return first


def postgres_cpu(postgres_pid: int) -> float:
    return sum(s for (part, _), s in profile.cpu_seconds({postgres_pid}).items() if part == "postgres")


async def measure(url: str, postgres_pid: int, args: argparse.Namespace) -> list[Run]:
    engine = make_engine(url)
    consumer = StateConsumer(make_sessionmaker(engine), None, StateRules(ProbationPolicy(0, 3600)))  # type: ignore[arg-type]
    db = await asyncpg.connect(url.replace("+asyncpg", ""))
    try:
        hosts = [born(f"bench-{i}") for i in range(4)]
        await consumer._transaction(hosts)
        ids = await seed(db, hosts[:3], args.n)
        # Move A's share to D, then back to A: every run moves rows the previous one wrote.
        movers = [hosts[3], hosts[0]]
        runs: list[Run] = []
        for i in range(args.runs):
            to = movers[i % 2]
            random.shuffle(ids)
            session = uuid.uuid4()
            reports = [
                ObserversStarted(service_id=to.service_id, session_id=session, redelivered=True, observer_ids=chunk)
                for chunk in (ids[j : j + args.per_message] for j in range(0, len(ids), args.per_message))
            ]
            batches = [reports[j : j + args.messages] for j in range(0, len(reports), args.messages)]
            pg_before, cpu_before, began = postgres_cpu(postgres_pid), time.process_time(), time.perf_counter()
            for batch in batches:
                await consumer._transaction(batch)
            wall, cpu = time.perf_counter() - began, time.process_time() - cpu_before
            pg = postgres_cpu(postgres_pid) - pg_before
            moved = await db.fetchval(f"SELECT count(*) FROM observers WHERE {ON_HOST}", to.service_id)
            assert moved == len(ids), f"{moved} of {len(ids)} rows moved"
            per_row = 1e6 / len(ids)
            runs.append(Run(len(ids), wall * per_row, cpu * per_row, pg * per_row, len(batches)))
            print(row(runs[-1]), flush=True)
        return runs
    finally:
        await db.close()
        await engine.dispose()


def row(run: Run) -> str:
    return (
        f"{run.rows:>9,} rows moved in {run.transactions} transactions: per row {run.wall_us:6.1f} µs wall, "
        f"{run.process_cpu_us:6.1f} µs state-process CPU, {run.postgres_cpu_us:6.1f} µs PostgreSQL CPU"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000, help="observers moved per run (and per host)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--per-message", type=int, default=100, help="ids per ObserversStarted")
    parser.add_argument("--messages", type=int, default=7, help="messages per transaction")
    args = parser.parse_args(argv)
    infra.up()
    rabbit, postgres = infra.rabbit_node(), infra.postgres_node()
    postgres_pid = postgres.live_pid()
    assert postgres_pid is not None, "PostgreSQL is not running"
    started = datetime.now(UTC)
    tag = f"bench_state_apply_{int(time.time())}"
    system = fresh_system(rabbit, postgres, tag, "orch-state-apply-")
    try:
        runs = uvloop.run(measure(system.database_url, postgres_pid, args))
    finally:
        rabbit.delete_vhost(tag, timeout=60)
        postgres.drop_database(tag)
    median = Run(
        args.n,
        statistics.median(r.wall_us for r in runs),
        statistics.median(r.process_cpu_us for r in runs),
        statistics.median(r.postgres_cpu_us for r in runs),
        runs[0].transactions,
    )
    print("median:", row(median))
    out = results_path("state-apply", started)
    document = {"started": started.isoformat(), "args": vars(args), "runs": [asdict(r) for r in runs]}
    write_results(out, document | {"median": asdict(median)})
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
