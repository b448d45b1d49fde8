"""``deploy/prometheus/alerts.yml`` and ``deploy/grafana/orchestrator.json``: what an operator
imports is whole (a summary and a description that says what to do for every alert; a
Grafana dashboard with its datasource input, unique panel ids, a grid that fits) and names
only metrics the code defines. ``tests/system/test_alerts.py`` checks the same names against
real ``/metrics`` answers, and promtool checks the rules (``make alerts-check``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from manager import metrics as manager_metrics
from observer_service import metrics as service_metrics

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "orchestrator.json"
NAME = re.compile(r"\borch_[a-z0-9_]+\b")
# The series each metric type adds to its name in the text format.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def exposed_names(*registries: CollectorRegistry) -> tuple[set[str], set[str]]:
    """(every series name the registries can expose, their families' names): queries may name
    only the first (``_created`` left out: never queried); prose may name a family too."""
    series: set[str] = set()
    families: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            families.add(family.name)
            series.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return series, families


def referenced_names(text: str) -> set[str]:
    return set(NAME.findall(text))


SERIES, FAMILIES = exposed_names(manager_metrics.REGISTRY, manager_metrics.STATE_REGISTRY, service_metrics.REGISTRY)


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_every_metric_the_alerts_name_is_defined() -> None:
    in_queries = set().union(*(referenced_names(rule["expr"]) for rule in alert_rules()))
    assert in_queries - SERIES == set(), f"alerts.yml queries series nobody defines: {sorted(in_queries - SERIES)}"
    in_text = referenced_names(ALERTS.read_text())
    assert in_text - SERIES - FAMILIES == set(), f"alerts.yml names metrics nobody defines: {sorted(in_text)}"


def test_every_metric_the_dashboard_names_is_defined() -> None:
    missing = referenced_names(DASHBOARD.read_text()) - SERIES
    assert not missing, f"orchestrator.json names metrics nobody defines: {sorted(missing)}"


def test_every_alert_has_a_severity_a_summary_and_a_description_that_says_what_to_do() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), names
    wanted = {
        "OrchServiceLost",
        "OrchObserversFailed",
        "OrchStateBacklogGrowing",
        "OrchPoolNearlyFull",
        "OrchStopStuck",
    }
    assert wanted <= set(names)
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert len(rule["annotations"]["description"].split()) >= 20, rule["alert"]


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def test_the_dashboard_imports_with_a_datasource_input_and_a_grid_that_fits() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    [source] = dashboard["__inputs"]
    assert source == source | {"name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus"}
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert NAME.search(target["expr"]), (panel["title"], target["expr"])
    # No two panels on the same cell
    cells = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels(dashboard)}
    assert len(cells) == len(ids)
