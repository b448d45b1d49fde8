"""The cost curve of ``bench/scale.py``: a point measured (``Point``), and the curve as text
(a row per point, a table) and as a PNG.

The issue's targets for 1,000,000 (all Processing; API p99 < 100 ms for get and stats and
< 250 ms for a list page; failover of the killed share in <= 2x the raw broker's redelivery
of the same count; the whole system idle under 5 % of one core) are checked on every point,
so the table shows where along the curve each one stops holding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

API_TARGETS_MS = {"list": 250.0, "get": 100.0, "stats": 100.0}
FAILOVER_TO_RAW = 2.0
IDLE_CPU_PCT = 5.0


@dataclass
class Point:
    size: int
    workload: str
    completed: bool = False
    stopped_at: str = ""  # the step that failed, and why
    settings: dict[str, str] = field(default_factory=dict)  # what the product ran with
    create_rate: float = 0.0  # observers accepted per second
    all_processing_s: float = 0.0
    service_kib_per_observer: float = 0.0
    broker_kib_per_observer: float = 0.0
    postgres_kib_per_observer: float = 0.0
    steady_cpu_s: dict[str, float] = field(default_factory=dict)
    steady_cpu_pct_of_core: float = 0.0
    steady_broker_work: list[dict[str, object]] = field(default_factory=list)  # as failover_broker_work
    events_per_s: float = 0.0
    lease_round_trip_p99_s: float = 0.0  # upper bound of the histogram bucket, steady window
    api_p99_ms: dict[str, float] = field(default_factory=dict)
    failover_count: int = 0
    failover_s: float = 0.0
    failover_cpu_s: dict[str, float] = field(default_factory=dict)  # per part, while it ran
    # The state consumer meanwhile: seconds busy per phase, batches, messages applied
    failover_state: dict[str, float] = field(default_factory=dict)
    # The broker meanwhile: the kinds of process that did the most reductions, its threads' busy
    # seconds per state, the collections of its largest heap (bench/broker_work.py)
    failover_broker_work: list[dict[str, object]] = field(default_factory=list)
    raw_redelivery_count: int = 0
    raw_redelivery_s: float = 0.0
    raw_redelivery_cpu_s: dict[str, float] = field(default_factory=dict)  # broker and surviving consumers
    raw_redelivery_broker_work: list[dict[str, object]] = field(default_factory=list)  # as failover_broker_work
    stop_count: int = 0
    stop_s: float = 0.0
    false_deaths: dict[str, int] = field(default_factory=dict)
    lowest_available_mib: float = 0.0
    teardown_error: str = ""  # cleaning up after it failed (the next point may be slower)


def verdicts(p: Point) -> dict[str, bool]:
    """Each target of the issue, held or not, at this point (only for a completed point)."""
    if not p.completed:
        return {}
    held = {f"{name} p99": p.api_p99_ms.get(name, 1e9) < limit for name, limit in API_TARGETS_MS.items()}
    held["failover <= 2x raw"] = p.raw_redelivery_s > 0 and p.failover_s <= FAILOVER_TO_RAW * p.raw_redelivery_s
    if p.workload == "idle":
        held["idle CPU < 5% of a core"] = p.steady_cpu_pct_of_core < IDLE_CPU_PCT
    held["0 false deaths"] = sum(p.false_deaths.values()) == 0
    return held


def row(p: Point) -> str:
    if not p.completed:
        return f"  {p.size:>9,} {p.workload:<8} DID NOT COMPLETE: {p.stopped_at}"
    missed = [name for name, ok in verdicts(p).items() if not ok]
    return (
        f"  {p.size:>9,} {p.workload:<8} create {p.create_rate:,.0f}/s, all Processing {p.all_processing_s:,.0f}s; "
        f"KiB/observer: service {p.service_kib_per_observer:.2f}, broker {p.broker_kib_per_observer:.2f}, "
        f"postgres {p.postgres_kib_per_observer:.2f}; steady CPU {p.steady_cpu_pct_of_core:.1f}% of a core; "
        f"p99 ms " + ", ".join(f"{k} {v:.0f}" for k, v in p.api_p99_ms.items()) + "; "
        f"failover of {p.failover_count:,} {p.failover_s:.2f}s (raw {p.raw_redelivery_s:.2f}s); "
        f"stop of {p.stop_count:,} {p.stop_s:.1f}s; events/s {p.events_per_s:,.0f}; "
        f"lease round trip p99 <= {p.lease_round_trip_p99_s:g}s; "
        f"false deaths {sum(p.false_deaths.values())}; "
        + ("all targets held" if not missed else "missed: " + ", ".join(missed))
    )


def table(points: list[Point]) -> str:
    head = (
        "size", "workload", "create/s", "all Proc. s", "svc KiB", "broker KiB", "pg KiB", "CPU %core",
        "list p99", "get p99", "stats p99", "failover s", "raw s", "stop 10% s", "events/s", "lease p99 s", "false d.",
    )  # fmt: skip
    rows: list[tuple[str, ...]] = [head]
    for p in points:
        if not p.completed:
            rows.append((f"{p.size:,}", p.workload, "did not complete", *[""] * (len(head) - 3)))
            continue
        rows.append(
            (
                f"{p.size:,}",
                p.workload,
                f"{p.create_rate:,.0f}",
                f"{p.all_processing_s:,.1f}",
                f"{p.service_kib_per_observer:.2f}",
                f"{p.broker_kib_per_observer:.2f}",
                f"{p.postgres_kib_per_observer:.2f}",
                f"{p.steady_cpu_pct_of_core:.1f}",
                *(f"{p.api_p99_ms.get(k, 0):.0f}" for k in ("list", "get", "stats")),
                f"{p.failover_s:.2f}",
                f"{p.raw_redelivery_s:.2f}",
                f"{p.stop_s:.1f}",
                f"{p.events_per_s:,.0f}",
                f"<= {p.lease_round_trip_p99_s:g}",
                str(sum(p.false_deaths.values())),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    notes = [f"* {p.size:,} {p.workload}: {p.stopped_at}" for p in points if not p.completed]
    return "\n".join(lines + notes)


def draw(points: list[Point], path: Path) -> Path:
    """Six panels against the number of observers (log scale), a line per workload."""
    import matplotlib  # a dev dependency, only the bench needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("time to all Processing (s)", lambda p: p.all_processing_s),
        ("memory per observer (KiB): service, broker, postgres", None),
        ("steady CPU (% of one core)", lambda p: p.steady_cpu_pct_of_core),
        ("API p99 (ms): list, get, stats", None),
        ("failover of the killed share (s), raw dashed", lambda p: p.failover_s),
        ("stop of 10% (s)", lambda p: p.stop_s),
    )
    figure, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (title, value) in zip(axes.flat, panels, strict=True):
        ax.set_title(title, fontsize=9)
        ax.set_xscale("log")
        ax.grid(True, alpha=0.3)
        for workload in sorted({p.workload for p in points}):
            done = sorted((p for p in points if p.workload == workload and p.completed), key=lambda p: p.size)
            sizes = [p.size for p in done]
            if value is not None:
                ax.plot(sizes, [value(p) for p in done], marker="o", label=workload)
            elif title.startswith("memory"):
                for attr, style in (("service", "-"), ("broker", "--"), ("postgres", ":")):
                    values = [getattr(p, f"{attr}_kib_per_observer") for p in done]
                    ax.plot(sizes, values, style, marker="o", label=f"{workload} {attr}")
            else:
                for name, style in (("list", "-"), ("get", "--"), ("stats", ":")):
                    ax.plot(
                        sizes, [p.api_p99_ms.get(name, 0) for p in done], style, marker="o", label=f"{workload} {name}"
                    )
            if title.startswith("failover"):
                ax.plot(sizes, [p.raw_redelivery_s for p in done], "--", marker="x", label=f"{workload} raw")
            for p in points:
                if p.workload == workload and not p.completed:
                    ax.axvline(p.size, color="red", alpha=0.3)  # a size that did not complete
        ax.legend(fontsize=7)
    figure.suptitle("observer-orchestrator on one machine (2 cores, 24 GiB): cost against the number of observers")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
