"""``bench.history`` (pure logic): what it counts from result files, and what it leaves out."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.history import failover_lines, load_runs, markdown_table, parse_run, report, targets


def figure(scenario: str, name: str, value: float, target: float | None, verdict: str, **extra: Any) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "name": name,
        "value": value,
        "unit": extra.get("unit", "s"),
        "target": target,
        "target_text": extra.get("target_text", "-" if target is None else f"<= {target}"),
        "decimals": extra.get("decimals"),
        "ratio": extra.get("ratio"),
        "verdict": verdict,
    }


def result(raw_s: float, failover_s: float, count: str = "10,002", **flags: Any) -> dict[str, Any]:
    verdict = "pass" if failover_s <= min(2.0, 4 * raw_s) else "FAIL"
    return {
        "quick": flags.get("quick", False),
        "profiled": flags.get("profiled", False),
        "what_if": flags.get("what_if"),
        "figures": [
            figure("raw", "redelivery of 10,000 after kill -9", raw_s, None, ""),
            figure("failover", f"kill -9 of host of {count} -> Processing", failover_s, 2.0, verdict),
            figure("failover", "false deaths", 0, 0, "pass", unit="", decimals=0, target_text="0"),
        ],
    }


def write(folder: Path, name: str, document: dict[str, Any]) -> None:
    (folder / name).write_text(json.dumps(document))


def test_quick_profiled_what_if_and_other_benches_are_left_out(tmp_path: Path) -> None:
    write(tmp_path, "20261124T100000Z.json", result(0.5, 1.2))
    write(tmp_path, "20261124T110000Z-quick.json", result(0.5, 1.2))
    write(tmp_path, "20261124T120000Z.json", result(0.5, 1.2, profiled=True))
    write(tmp_path, "20261124T130000Z.json", result(0.5, 1.2, quick=True))
    write(tmp_path, "20261124T133000Z.json", result(0.5, 1.2, what_if="hot-moves"))
    write(tmp_path, "scale-20261124T140000Z.json", {"rows": []})
    write(tmp_path, "state-apply-20261124T150000Z.json", {"runs": []})
    assert [run.name for run in load_runs(tmp_path)] == ["20261124T100000Z.json"]


def test_a_figure_is_counted_under_its_latest_name_with_each_runs_own_verdict() -> None:
    runs = [
        parse_run("a", "20261122T040000Z", result(0.5, 1.1, count="10,000")),
        parse_run("b", "20261126T040000Z", result(1.4, 2.3)),
        parse_run("c", "20261127T040000Z", result(1.2, 1.9)),
    ]
    assert all(run is not None for run in runs)
    by_name = {(t.scenario, t.name): t for t in targets(r for r in runs if r is not None)}
    failover = by_name[("failover", "kill -9 of host of 10,002 -> Processing")]
    assert failover.values == [1.1, 2.3, 1.9]
    assert failover.passes == 2
    assert by_name[("each scenario", "false deaths")].passes == 3
    assert ("raw", "redelivery of 10,000 after kill -9") not in by_name  # no target: not a target


def test_failover_against_raw_of_the_same_run() -> None:
    runs = [
        parse_run(str(i), "20261126T040000Z", result(raw, fo))
        for i, (raw, fo) in enumerate([(1.0, 1.5), (1.5, 2.4), (0.4, 1.9)])
    ]
    text = "\n".join(failover_lines([r for r in runs if r is not None]))
    assert "3 runs" in text
    assert "0.40 to 1.50 s (median 1.00 s)" in text  # raw
    assert "1.50 to 2.40 s (median 1.90 s)" in text  # failover
    assert "1.50 to 4.75x (median 1.60x)" in text  # each failover over its own run's raw
    assert "failover <= 2 s           2 of 3" in text
    assert "failover <= 4x raw        2 of 3" in text


def test_split_reports_each_side_of_the_day() -> None:
    runs = [
        parse_run("run-a", "20261125T235959Z", result(0.5, 1.2)),
        parse_run("run-b", "20261126T000000Z", result(1.5, 2.5)),
    ]
    text = report([r for r in runs if r is not None], datetime(2026, 11, 26, tzinfo=UTC))
    before, after = text.split("from 2026-11-26 00:00 UTC")
    assert "1 runs, run-a to run-a" in before and "run-b" not in before
    assert "failover <= 2 s           1 of 1" in before
    assert "1 runs, run-b to run-b" in after and "run-a" not in after
    assert "failover <= 2 s           0 of 1" in after


def test_markdown_table_shows_each_figure_as_written() -> None:
    document = result(0.56, 1.25)
    document["figures"][1]["ratio"] = 1.6
    run = parse_run("r", "20261124T040000Z", document)
    assert run is not None
    lines = markdown_table(run).splitlines()
    assert lines[0] == "| scenario | figure | value | target | ratio | verdict |"
    assert lines[2] == "| raw | redelivery of 10,000 after kill -9 | 0.560 s |  |  |  |"
    assert lines[3] == "| failover | kill -9 of host of 10,002 -> Processing | 1.250 s | <= 2.0 | 1.60 | pass |"
    assert lines[4] == "| failover | false deaths | 0 | 0 |  | pass |"
