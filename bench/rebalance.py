"""``python -m bench.rebalance``: a rolling restart of a loaded fleet, and how the balancer
evens it afterwards (issue 56; docs/design.md, "Even load").

A manager and three services of N workers each, at the product's defaults; N idle observers
created in bulk. Then each service in turn gets SIGTERM and is started again under its name,
as a deploy does, once all N are Processing again. Reported, after the last restart:

* ``until even``: seconds until every service runs within 10 % of the mean (the target: 60 s);
* ``moves``: observers the balancer handed over (``orch_handovers_total``), against the fewest
  that could even the fleet (what the emptiest service lacked);
* ``not running``: per moved observer, the seconds from the balancer's request to its start
  on the new host, read from its ``rebalanced`` event (p50, p99, max): an upper bound of the
  time it ran nowhere, which begins only once its old host has ended it.

    python -m bench.rebalance                 # N = 30,000
    python -m bench.rebalance --size 3000

Prints figure, target and verdict side by side and writes ``bench/results/rebalance-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from datetime import UTC, datetime

import asyncpg

from bench.cluster import until
from bench.fresh import create_idle, fresh_system
from bench.results_file import results_path, write_results
from bench.scale import SCALE_ENV
from bench.scenarios import BULK
from tools import infra
from tools.harness import System, metric

_EVEN_WITHIN_S = 60.0
_GIVE_UP_S = 600.0  # reported as a miss rather than waited for
_NAMES = ("svc-0", "svc-1", "svc-2")
_HELD = (
    "SELECT s.name, coalesce(sum(h.n), 0) FROM services s LEFT JOIN ("
    "SELECT service_id, n FROM held_digests UNION ALL SELECT service_id, n FROM held_digest_deltas) h "
    "ON h.service_id = s.id WHERE s.status = 'alive' GROUP BY s.name"
)
_MOVES = re.escape('orch_handovers_total{reason="even load"}')
_GAP = re.compile(r"started here ([0-9.]+) s after it was asked")


async def held(db: asyncpg.Connection) -> dict[str, int]:
    return {name: int(n) for name, n in await db.fetch(_HELD)}


async def until_processing(db: asyncpg.Connection, size: int) -> None:
    async def done() -> bool:
        return int(await db.fetchval("SELECT count(*) FROM observers WHERE status = 'Processing'")) >= size

    await until(done)


def even(counts: dict[str, int], size: int) -> bool:
    mean = size / len(_NAMES)
    return len(counts) == len(_NAMES) and all(abs(n - mean) <= 0.1 * mean for n in counts.values())


async def rolling_restart(system: System, size: int) -> dict[str, object]:
    procs = {name: system.start_service(name, size) for name in _NAMES}
    db = await asyncpg.connect(system.database_url.replace("+asyncpg", ""))
    try:
        await create_idle(system.base_url, size, "r-", BULK)
        await until_processing(db, size)
        print(f"  {size:,} Processing: {await held(db)}", flush=True)
        before = metric(system, _MOVES)
        lacking = 0
        for name in _NAMES:
            await asyncio.to_thread(procs[name].terminate, 300)
            procs[name] = await asyncio.to_thread(system.start_service, name, size)
            await until_processing(db, size)
            counts = await held(db)
            lacking = max(0, round(size / len(_NAMES)) - counts.get(name, 0))
            print(f"  {name} restarted: {counts}", flush=True)
        restarted = time.monotonic()

        async def evened() -> bool:
            return even(await held(db), size) or time.monotonic() - restarted > _GIVE_UP_S

        await until(evened)
        even_s = time.monotonic() - restarted
        if not even(await held(db), size):
            print(f"  not even after {_GIVE_UP_S:.0f} s: {await held(db)}", flush=True)
        counts = await held(db)
        await asyncio.sleep(3)  # the last hand-overs' events
        moves = metric(system, _MOVES) - before
        details = await db.fetch("SELECT detail FROM observer_events WHERE event = 'rebalanced'")
    finally:
        await db.close()
    gaps = sorted(float(m.group(1)) for d in details if d["detail"] and (m := _GAP.search(d["detail"])))
    return {
        "until_even_s": even_s,
        "counts": counts,
        "moves": moves,
        "fewest_moves": lacking,
        "gap_p50_s": statistics.median(gaps) if gaps else None,
        "gap_p99_s": gaps[int(0.99 * (len(gaps) - 1))] if gaps else None,
        "gap_max_s": gaps[-1] if gaps else None,
        "rebalanced_events": len(gaps),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=30_000)
    args = parser.parse_args(argv)
    infra.up()
    rabbit, postgres = infra.rabbit_node(), infra.postgres_node()
    started = datetime.now(UTC)
    tag = f"bench_rebalance_{int(time.time())}"
    system = fresh_system(rabbit, postgres, tag, "orch-rebalance-")
    system.env |= SCALE_ENV
    try:
        system.start_manager()
        result = asyncio.run(rolling_restart(system, args.size))
    finally:
        system.stop_all()
        rabbit.delete_vhost(tag, timeout=600)
        postgres.drop_database(tag)
    out = results_path("rebalance", started)
    write_results(out, {"started": started.isoformat(), "size": args.size, **result})
    print_result(result, args.size)
    print(f"results written to {out}")
    return 0


def print_result(r: dict[str, object], size: int) -> None:
    def s(value: object) -> str:
        return "-" if value is None else f"{float(str(value)):.3f} s"

    verdict = "pass" if float(str(r["until_even_s"])) <= _EVEN_WITHIN_S else "MISS"
    print(f"\nrolling restart of 3 services holding {size:,} idle observers, then the balancer:")
    print(
        f"  {'until every service is within 10 % of the mean':<50}{s(r['until_even_s']):>12}  target <= 60 s  {verdict}"
    )
    print(f"  {'observers handed over':<50}{float(str(r['moves'])):>12,.0f}  fewest possible {r['fewest_moves']:,}")
    print(f"  {'request -> start elsewhere, p50':<50}{s(r['gap_p50_s']):>12}")
    print(f"  {'request -> start elsewhere, p99':<50}{s(r['gap_p99_s']):>12}")
    print(f"  {'request -> start elsewhere, max':<50}{s(r['gap_max_s']):>12}")
    print(f"  final counts: {r['counts']}")


if __name__ == "__main__":
    sys.exit(main())
