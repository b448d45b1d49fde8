"""``python -m bench.history``: what the ``make bench`` result files say, target by target.

``docs/benchmarks.md`` says where each target of ``make bench`` stands on this machine. The
machine's speed has changed under the same code (the raw broker redelivered 10,000 in a median 0.48 s
until 2026-11-24 and 1.40 s since 2026-11-26), so one run proves little; this reads every
result file in ``bench/results/`` (a clean clone has the committed ones) and says it from
all of them, so its claim can be checked, and made again after new runs.

    python -m bench.history                        # each target: runs, passes, median, range
    python -m bench.history --split 2026-11-26     # the same, before and from that day (UTC)
    python -m bench.history --split 2026-11-27T12:00  # or that time
    python -m bench.history --table FILE           # one run as docs/benchmarks.md's markdown table

Counted: runs at full size (not ``--quick``), not profiled and with no ``what_if`` (the eighth
session's ``--what-if hot-moves`` runs, before migration 0011 made that the schema); a run
made with ``--only`` counts for the scenarios it ran. The failover's ratio is to the raw
redelivery of the same run, as its target is.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.figures import Figure
from bench.results_file import RESULTS

_RUN_FILE = re.compile(r"(\d{8}T\d{6}Z)\.json")
RAW_REDELIVERY = ("raw", "redelivery of 10,000 after kill -9")
FALSE_DEATHS = "false deaths"
EACH_SCENARIO = "each scenario"
# Figure names carry their counts ("host of 10,000", later "10,002"): one figure all the same.
_COUNT = re.compile(r"\d[\d,]*")


@dataclass(frozen=True)
class Run:
    name: str
    started: datetime  # UTC, from the file name
    figures: dict[tuple[str, str], dict[str, Any]]  # (scenario, name) -> the figure as written


def load_runs(folder: Path = RESULTS) -> list[Run]:
    """Every full-size, unprofiled ``make bench`` result in ``folder``, oldest first."""
    runs = []
    for path in sorted(folder.glob("*.json")):
        match = _RUN_FILE.fullmatch(path.name)
        if not match:
            continue  # quick runs, and the other benches' files
        document = json.loads(path.read_text())
        run = parse_run(path.name, match.group(1), document)
        if run is not None:
            runs.append(run)
    return runs


def parse_run(name: str, started: str, document: dict[str, Any]) -> Run | None:
    if document.get("quick") or document.get("profiled") or document.get("what_if") or "figures" not in document:
        return None
    figures = {(f["scenario"], f["name"]): f for f in document["figures"]}
    return Run(name, datetime.strptime(started, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC), figures)


@dataclass
class Target:
    """One targeted figure over a set of runs, under its latest name and target; each run's
    verdict is the one it wrote, against the target of its day."""

    scenario: str
    name: str = ""
    target_text: str = ""
    values: list[float] = field(default_factory=list)
    passes: int = 0

    def add(self, figure: dict[str, Any]) -> None:
        self.name, self.target_text = figure["name"], figure["target_text"]
        self.values.append(figure["value"])
        self.passes += figure["verdict"] == "pass"

    def line(self) -> str:
        values = sorted(self.values)
        counted = "scenario runs" if self.scenario == EACH_SCENARIO else "runs"
        return (
            f"{self.scenario:<14} {self.name[:44]:<44} {len(values):>3} {counted}, {self.passes:>3} pass; "
            f"median {_number(statistics.median(values))}, {_number(values[0])} to {_number(values[-1])} "
            f"(latest target: {self.target_text})"
        )


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def targets(runs: Iterable[Run]) -> list[Target]:
    """Each figure that has a target, in the order it first appears; the false deaths of
    every scenario as one (each scenario of each run counts once)."""
    found: dict[tuple[str, str], Target] = {}
    for run in runs:
        for (scenario, name), figure in run.figures.items():
            if figure.get("target") is None:
                continue
            if name == FALSE_DEATHS:
                scenario = EACH_SCENARIO
            found.setdefault((scenario, _COUNT.sub("N", name)), Target(scenario)).add(figure)
    return list(found.values())


def failover_lines(runs: Sequence[Run]) -> list[str]:
    """The failover against the raw redelivery of the same run."""
    pairs = []
    for run in runs:
        raw = run.figures.get(RAW_REDELIVERY)
        failover = next((f for (s, n), f in run.figures.items() if s == "failover" and n != FALSE_DEATHS), None)
        if raw is not None and failover is not None:
            pairs.append((raw["value"], failover["value"]))
    if not pairs:
        return []
    raws, failovers, ratios = (sorted(column) for column in zip(*((r, f, f / r) for r, f in pairs), strict=True))

    def spread(values: list[float], unit: str) -> str:
        return f"{values[0]:.2f} to {values[-1]:.2f}{unit} (median {statistics.median(values):.2f}{unit})"

    return [
        f"  failover against raw, {len(pairs)} runs:",
        f"    raw redelivery of 10,000  {spread(raws, ' s')}",
        f"    failover of 10,002        {spread(failovers, ' s')}",
        f"    failover / raw            {spread(ratios, 'x')}",
        f"    failover <= 2 s           {sum(f <= 2.0 for f in failovers)} of {len(failovers)}",
        f"    failover <= 4x raw        {sum(f <= 4 * r for r, f in pairs)} of {len(pairs)}",
    ]


_FIGURE_FIELDS = tuple(Figure.__dataclass_fields__)


def markdown_table(run: Run) -> str:
    """One run's figures as docs/benchmarks.md shows them."""
    lines = ["| scenario | figure | value | target | ratio | verdict |", "|---|---|---|---|---|---|"]
    for figure in run.figures.values():
        # Shown as the bench printed it; the ratio and verdict as the run wrote them.
        shown = Figure(**{k: figure[k] for k in _FIGURE_FIELDS if k in figure}).shown().strip()
        ratio = "" if figure.get("ratio") is None else f"{figure['ratio']:.2f}"
        target = "" if figure.get("target_text") in (None, "-") else figure["target_text"]
        cells = (figure["scenario"], figure["name"], shown, target, ratio, figure.get("verdict") or "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(runs: Sequence[Run], split: datetime | None) -> str:
    periods = [("all runs", runs)]
    if split is not None:
        periods = [
            (f"before {split:%Y-%m-%d %H:%M} UTC", [r for r in runs if r.started < split]),
            (f"from {split:%Y-%m-%d %H:%M} UTC", [r for r in runs if r.started >= split]),
        ]
    out = []
    for title, chosen in periods:
        if not chosen:
            out.append(f"{title}: no runs")
            continue
        out.append(f"{title}: {len(chosen)} runs, {chosen[0].name} to {chosen[-1].name}")
        out += ["  " + target.line() for target in targets(chosen)]
        out += failover_lines(chosen)
    return "\n".join(out)


def _utc(text: str) -> datetime:
    """A day or a time (``2026-11-26``, ``2026-11-27T12:00``), in UTC as the file names are."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", type=_utc, help="report before and from this day or time (UTC)")
    parser.add_argument("--table", type=Path, help="print this result file as a markdown table")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder of result files")
    args = parser.parse_args(argv)
    if args.table is not None:
        match = _RUN_FILE.fullmatch(args.table.name)
        started = match.group(1) if match else "19700101T000000Z"  # a renamed copy: no time needed
        run = parse_run(args.table.name, started, json.loads(args.table.read_text()))
        if run is None:
            parser.error(f"{args.table} is a quick, profiled or what-if run, or not a make bench result")
        print(markdown_table(run))
        return 0
    runs = load_runs(args.results)
    if not runs:
        print(f"no make bench results in {args.results}", file=sys.stderr)
        return 1
    print(report(runs, args.split))
    return 0


if __name__ == "__main__":
    sys.exit(main())
