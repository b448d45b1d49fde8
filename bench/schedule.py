"""``python -m bench.schedule``: scheduled starts (issue 56, part 3; docs/design.md,
"Scheduled start and stop").

* ``burst``: a manager and three services with the product's defaults, N idle observers
  created now (the create rate, the yardstick), stopped, then N scheduled for one same
  second: how late each one's start was published (its ``due`` event) and reported running
  (its ``started`` event) after its start_at, min/p50/p99/max, and the rate from the first
  start published to the last one running. One observer scheduled alone first: its lateness is the 1-s promise.
* ``index``: on a database of its own, R Scheduled rows made with ``generate_series`` (the
  first 1,000 due, the rest over the next 30 days, each with a stop_at): EXPLAIN of the
  scheduler's two due-row queries (``manager/db/schedule.py``) must show an index scan of
  their partial index, and their time (median of 20 runs) with one batch of 1,000 due.

    python -m bench.schedule                     # N = 10,000, R = 1,000,000
    python -m bench.schedule --size 2000 --rows 100000

Prints figures and targets side by side and writes ``bench/results/schedule-<time>.json``.
A missed target is reported, never a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx

from bench.fresh import create_idle, fresh_system
from bench.results_file import results_path, write_results
from bench.scale import SCALE_ENV
from manager.db.schedule import DUE_STARTS_SQL, DUE_STOPS_SQL, NEXT_DUE
from tools import infra
from tools.harness import System, wait_for

WORKERS = 4000  # per service, three services: room for the burst
TIMED_RUNS = 20


@dataclass
class Figures:
    size: int = 0
    rows: int = 0
    create_per_s: float = 0.0
    alone_due_late_s: float = 0.0
    alone_started_late_s: float = 0.0
    due_late_s: dict[str, float] = field(default_factory=dict)  # p50, p99, max
    started_late_s: dict[str, float] = field(default_factory=dict)
    scheduled_per_s: float = 0.0
    start_plan: str = ""
    start_query_ms: float = 0.0
    stop_plan: str = ""
    stop_query_ms: float = 0.0
    next_plan: str = ""
    next_query_ms: float = 0.0
    insert_s: float = 0.0


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "min": ordered[0],
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max": ordered[-1],
    }


_LATENESS = """
    SELECT e.event, extract(epoch FROM min(e.at) - o.start_at) AS late
    FROM observers o JOIN observer_events e ON e.observer_id = o.id
    WHERE o.name LIKE $1 AND e.event IN ('due', 'started')
    GROUP BY o.id, e.event
"""


async def lateness(system: System, prefix: str) -> tuple[list[float], list[float]]:
    """Seconds after start_at of each observer's first ``due`` and first ``started`` events."""
    db = await asyncpg.connect(system.database_url.replace("+asyncpg", ""))
    try:
        rows = await db.fetch(_LATENESS, prefix + "%")
    finally:
        await db.close()
    due = [float(r["late"]) for r in rows if r["event"] == "due"]
    started = [float(r["late"]) for r in rows if r["event"] == "started"]
    return due, started


def processing(system: System) -> int:
    return int(system.get("/api/stats").json()["observers"]["Processing"])


def burst(system: System, size: int, figures: Figures) -> None:
    system.start_manager()
    for i in range(3):
        system.start_service(f"svc-{i}", workers=WORKERS)

    # The yardstick: the same number created now, in bulk, until all run; then stopped.
    began = time.monotonic()
    asyncio.run(create_idle(system.base_url, size, "now-"))
    wait_for(lambda: processing(system) == size, 300, "the creates to run", every=0.25)
    figures.create_per_s = size / (time.monotonic() - began)
    ids = [o["id"] for o in system.observers(status="Processing")]
    for i in range(0, len(ids), 10_000):
        assert system.post("/api/observers/bulk-stop", {"ids": ids[i : i + 10_000]}).status_code == 202
    wait_for(lambda: system.get("/api/stats").json()["observers"]["Deleted"] == size, 300, "the stops", every=0.5)

    # One alone: the 1-s promise.
    alone_at = datetime.now(UTC) + timedelta(seconds=2)
    system.create("alone", kind="idle", start_at=alone_at.isoformat())
    wait_for(lambda: processing(system) == 1, 60, "the one scheduled alone to run", every=0.1)
    due, started = asyncio.run(lateness(system, "alone"))
    figures.alone_due_late_s, figures.alone_started_late_s = due[0], started[0]

    # N for one second: created well before it, all Scheduled until then.
    start_at = (datetime.now(UTC) + timedelta(seconds=10 + size / 2000)).replace(microsecond=0)

    async def schedule_all() -> None:
        async with httpx.AsyncClient(base_url=system.base_url, timeout=120) as http:
            for first in range(0, size, 1000):
                names = range(first, min(size, first + 1000))
                one = {"kind": "idle", "start_at": start_at.isoformat()}
                body = {"observers": [{"name": f"at-{i}"} | one for i in names]}
                (await http.post("/api/observers/bulk", json=body)).raise_for_status()

    asyncio.run(schedule_all())
    if datetime.now(UTC) >= start_at:
        print("WARNING: the scheduling took longer than its margin; the lateness below includes it", file=sys.stderr)
    wait_for(lambda: processing(system) == size + 1, 300 + size / 100, "the scheduled ones to run", every=0.25)
    due, started = asyncio.run(lateness(system, "at-"))
    assert len(due) == len(started) == size, (len(due), len(started))
    figures.due_late_s = _percentiles(due)
    figures.started_late_s = _percentiles(started)
    # From the first start published to the last one running: the scheduled path's own rate,
    # as the create's is from its first request to its last one running.
    figures.scheduled_per_s = size / (max(started) - min(due))


async def index(system: System, rows: int, figures: Figures) -> None:
    db = await asyncpg.connect(system.database_url.replace("+asyncpg", ""))
    try:
        began = time.monotonic()
        await db.execute(
            """
            INSERT INTO observers (id, name, kind, pool, status, start_at, stop_at)
            SELECT gen_random_uuid(), 'sched-' || i, 'idle', 'default', 'Scheduled', t, t + interval '1 hour'
            FROM (SELECT i, CASE WHEN i <= 1000 THEN now() - interval '1 second'
                                 ELSE now() + (i::float8 / $1) * interval '30 days' END AS t
                  FROM generate_series(1, $1) AS i) AS s
            """,
            rows,
        )
        await db.execute("ANALYZE observers")
        figures.insert_s = time.monotonic() - began
        start_sql = DUE_STARTS_SQL.replace(":now", "now()").replace(":limit", "1000")
        # The stop query at the moment the first 1,000 are due to stop.
        stop_sql = DUE_STOPS_SQL.replace(":now", "now() + interval '1 hour'").replace(":limit", "1000")
        figures.start_plan, figures.start_query_ms = await _explain(db, start_sql)
        figures.stop_plan, figures.stop_query_ms = await _explain(db, stop_sql)
        figures.next_plan, figures.next_query_ms = await _explain(db, str(NEXT_DUE.text), rows=1)
    finally:
        await db.close()


async def _explain(db: asyncpg.Connection, sql: str, rows: int = 1000) -> tuple[str, float]:
    plan = "\n".join(r[0] for r in await db.fetch("EXPLAIN " + sql))
    times = []
    for _ in range(TIMED_RUNS):
        began = time.perf_counter()
        found = await db.fetch(sql)
        times.append((time.perf_counter() - began) * 1000)
        assert len(found) == rows, len(found)
    return plan, statistics.median(times)


def report(f: Figures) -> list[dict[str, Any]]:
    start_indexed = "Index Scan using ix_observers_due_start" in f.start_plan
    stop_indexed = "Index Scan using ix_observers_due_stop" in f.stop_plan
    rows = [
        ("one scheduled alone: started after start_at", f"{f.alone_started_late_s:.3f} s", "<= 1 s",
         f.alone_started_late_s <= 1.0),
        ("  its start published after start_at", f"{f.alone_due_late_s:.3f} s", "", None),
        (f"create of {f.size:,} now -> Processing", f"{f.create_per_s:,.0f} obs/s", "", None),
        (f"{f.size:,} due in one second -> Processing", f"{f.scheduled_per_s:,.0f} obs/s",
         f">= 80% of create ({0.8 * f.create_per_s:,.0f})", f.scheduled_per_s >= 0.8 * f.create_per_s),
        ("  start published after start_at min/p50/p99/max",
         "/".join(f"{f.due_late_s[k]:.2f}" for k in ("min", "p50", "p99", "max")) + " s", "", None),
        ("  started after start_at min/p50/p99/max",
         "/".join(f"{f.started_late_s[k]:.2f}" for k in ("min", "p50", "p99", "max")) + " s", "", None),
        (f"due starts among {f.rows:,} Scheduled: plan", "index scan" if start_indexed else "NO index scan",
         "index scan", start_indexed),
        ("  its time (1,000 due)", f"{f.start_query_ms:.2f} ms", "<= 10 ms", f.start_query_ms <= 10),
        (f"due stops among {f.rows:,} with stop_at: plan", "index scan" if stop_indexed else "NO index scan",
         "index scan", stop_indexed),
        ("  its time (1,000 due)", f"{f.stop_query_ms:.2f} ms", "<= 10 ms", f.stop_query_ms <= 10),
        ("next due time (the scheduler's wake-up): plan",
         "no seq scan" if "Seq Scan" not in f.next_plan else "SEQ SCAN", "no seq scan", "Seq Scan" not in f.next_plan),
        ("  its time", f"{f.next_query_ms:.2f} ms", "<= 10 ms", f.next_query_ms <= 10),
    ]  # fmt: skip
    print(f"\n{'figure':<50}{'value':>22}  {'target':<26}verdict")
    out = []
    for name, value, target, passed in rows:
        verdict = "" if passed is None else ("pass" if passed else "MISS")
        print(f"{name:<50}{value:>22}  {target:<26}{verdict}")
        out.append({"figure": name, "value": value, "target": target, "passed": passed})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.schedule", description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=10_000, help="observers scheduled for one second")
    parser.add_argument("--rows", type=int, default=1_000_000, help="Scheduled rows for the index figures")
    args = parser.parse_args(argv)
    infra.up()
    rabbit, postgres = infra.rabbit_node(), infra.postgres_node()
    figures = Figures(size=args.size, rows=args.rows)
    tag = f"bench_schedule_{int(time.time())}"
    system = fresh_system(rabbit, postgres, tag, "orch-schedule-")
    system.env |= SCALE_ENV
    try:
        burst(system, args.size, figures)
    finally:
        system.stop_all()
        rabbit.delete_vhost(tag, timeout=600)
        postgres.drop_database(tag)
    tag = f"bench_schedule_index_{int(time.time())}"
    system = fresh_system(rabbit, postgres, tag, "orch-schedule-")
    try:
        asyncio.run(index(system, args.rows, figures))
    finally:
        postgres.drop_database(tag)
        rabbit.delete_vhost(tag, timeout=600)
    for what, plan in (("due-start", figures.start_plan), ("due-stop", figures.stop_plan), ("next", figures.next_plan)):
        print(f"\n{what} plan:\n{plan}")
    table = report(figures)
    out = results_path("schedule")
    write_results(out, {"figures": asdict(figures), "table": table})
    print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
