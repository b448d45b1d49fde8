"""Rich renderables for the ``orchestrator`` command line (``cli.main``).

Pure functions from API bodies (plain JSON) to tables, so the commands stay thin. Every
value that comes from the API is wrapped in ``Text``: a plain string cell would be parsed
as rich markup, and an error message such as ``observers[0]: ...`` would lose its brackets.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

JSON = Any  # an API body: dicts, lists and scalars as httpx decoded them

STATUS_STYLES = {
    "Scheduled": "blue",
    "Created": "cyan",
    "Processing": "green",
    "OnDeleting": "yellow",
    "Deleted": "dim",
    "Failed": "bold red",
    "alive": "green",
    "lost": "red",
    "deleted": "dim",
}
OBSERVER_STATUSES = ("Scheduled", "Created", "Processing", "OnDeleting", "Deleted", "Failed")


def short_id(value: str | None) -> str:
    """The first 8 hex digits: enough to tell rows apart on screen; full ids are in --json and show."""
    return value[:8] if value else "-"


def cell(value: object, style: str = "") -> Text:
    if value is None or value == "":
        return Text("-", style="dim")
    return Text(str(value), style=style)


def status_cell(status: str | None) -> Text:
    return cell(status, STATUS_STYLES.get(status or "", ""))


def age(timestamp: str | None, now: datetime | None = None) -> str:
    """'3m12s ago' style ages read faster than ISO timestamps in a table."""
    if not timestamp:
        return "-"
    try:
        then = datetime.fromisoformat(timestamp)
    except ValueError:
        return timestamp
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    seconds = max(0, int(((now or datetime.now(UTC)) - then).total_seconds()))
    return f"{duration(seconds)} ago"


def duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def observers_table(items: list[JSON], full_ids: bool = False) -> Table:
    table = Table(title=f"{len(items)} observer(s)", title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("name", no_wrap=True)
    for col in ("kind", "pool", "status", "service"):
        table.add_column(col)
    table.add_column("attempts", justify="right")
    table.add_column("created")
    table.add_column("last error", overflow="ellipsis", no_wrap=True, max_width=50)  # one line per observer
    for o in items:
        table.add_row(
            cell(o["id"] if full_ids else short_id(o["id"])),
            cell(o["name"], "bold"),
            cell(o["kind"]),
            cell(o["pool"]),
            status_cell(o["status"]),
            cell(o.get("service_name") or (short_id(o["service_id"]) if o.get("service_id") else None)),
            cell(o.get("attempts")),
            cell(age(o.get("created_at"))),
            cell(o.get("last_error"), "red"),
        )
    return table


def observer_detail(o: JSON) -> Table:
    """Key/value grid of one observer, with the full id (the one to pass to other commands)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    service = o.get("service_id")
    if o.get("service_name"):  # a create's or a stop's answer carries the id only
        service = f"{o['service_name']} ({service})"
    rows: list[tuple[str, Text]] = [
        ("id", cell(o["id"])),
        ("name", cell(o["name"], "bold")),
        ("kind", cell(o["kind"])),
        ("status", status_cell(o["status"])),
        ("pool", cell(o["pool"])),
        ("service", cell(service)),
        ("attempts", cell(o.get("attempts"))),
        ("last error", cell(o.get("last_error"), "red")),
        ("args", cell(_compact(o.get("args")))),
        ("isolation", cell(o.get("isolation") or "kind default")),
        ("memory limit", cell(f"{o['memory_limit_mb']} MB" if o.get("memory_limit_mb") else None)),
        ("retry", cell(_compact(o.get("retry")) if o.get("retry") else "default")),
        ("start at", cell(o.get("start_at"))),
        ("stop at", cell(o.get("stop_at"))),
        ("created", cell(f"{o.get('created_at')} ({age(o.get('created_at'))})")),
        ("modified", cell(f"{o.get('modified_at')} ({age(o.get('modified_at'))})")),
    ]
    for key, value in rows:
        grid.add_row(key, value)
    return grid


def events_table(events: list[JSON], service_names: dict[str, str], shown_from: int = 0) -> Table:
    title = f"history: {len(events)} event(s)" + (f", the first {shown_from} not shown" if shown_from else "")
    table = Table(title=title, title_justify="left")
    for col in ("at", "event", "service", "from", "detail"):
        table.add_column(col)

    def svc(service_id: str | None) -> Text:
        return cell(service_names.get(service_id, short_id(service_id)) if service_id else None)

    for e in events[shown_from:]:
        table.add_row(
            cell(e.get("at")),
            cell(e.get("event"), "bold"),
            svc(e.get("service_id")),
            svc(e.get("from_service_id")),
            cell(e.get("detail")),
        )
    return table


def services_table(services: list[JSON]) -> Table:
    table = Table(title=f"{len(services)} service(s)", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("status")
    table.add_column("id", no_wrap=True)
    table.add_column("host")
    table.add_column("pid", justify="right")
    table.add_column("pools")
    table.add_column("running", justify="right")
    table.add_column("process slots", justify="right")
    table.add_column("loop lag", justify="right")
    table.add_column("heartbeat", justify="right")
    table.add_column("kinds")
    for s in services:
        table.add_row(
            cell(s["name"], "bold"),
            status_cell("draining" if s.get("draining") else s["status"]),
            cell(short_id(s["id"])),
            cell(s.get("host")),
            cell(s.get("pid")),
            cell(", ".join(s.get("pools") or [])),
            cell(
                f"{s.get('running', 0)}/{s.get('workers_count', 0)}"
                + (f" ({s['drain_note']})" if s.get("draining") else "")
            ),
            cell(s.get("process_slots")),
            cell(f"{s.get('loop_lag_ms', 0):.0f} ms"),
            cell(f"{s.get('heartbeat_age_s', 0):.1f}s ago"),
            cell(", ".join(s.get("kinds") or [])),
        )
    return table


def _drain_note(service: JSON) -> str:
    return f" ({service.get('drain_note') or 'draining'})" if service.get("draining") else ""


def stats_view(stats: JSON) -> RenderableType:
    parts: list[RenderableType] = [_counts_table("observers", stats.get("observers") or {})]
    parts.append(_counts_table("services", stats.get("services") or {}))
    capacity = Table(title="capacity per pool", title_justify="left")
    for col in ("pool", "total", "used", "free", "used %"):
        capacity.add_column(col, justify="left" if col == "pool" else "right")
    for pool, c in (stats.get("capacity") or {}).items():
        percent = f"{100 * c['used'] / c['total']:.0f}%" if c.get("total") else "-"
        capacity.add_row(cell(pool, "bold"), cell(c["total"]), cell(c["used"]), cell(c["free"]), cell(percent))
    parts.append(capacity)
    kinds = stats.get("kinds")  # newer managers only: observers per kind, then per status
    if kinds:
        parts.append(_kinds_counts_table(kinds))
    return Group(*parts)


def _counts_table(title: str, counts: dict[str, int]) -> Table:
    table = Table(title=f"{title}: {sum(counts.values())}", title_justify="left")
    table.add_column("status")
    table.add_column("count", justify="right")
    for status, count in counts.items():
        table.add_row(status_cell(status), cell(count, "" if count else "dim"))
    return table


def _kinds_counts_table(kinds: dict[str, dict[str, int]]) -> Table:
    statuses = [s for s in OBSERVER_STATUSES if any(s in v for v in kinds.values())]
    statuses += sorted({s for v in kinds.values() for s in v} - set(statuses))  # statuses this CLI does not know
    table = Table(title="observers per kind", title_justify="left")
    table.add_column("kind")
    for status in statuses:
        table.add_column(Text(status, style=STATUS_STYLES.get(status, "")), justify="right")
    for kind, counts in kinds.items():
        table.add_row(cell(kind, "bold"), *(cell(counts.get(s, 0), "" if counts.get(s) else "dim") for s in statuses))
    return table


def kinds_table(kinds: list[JSON]) -> Table:
    table = Table(title=f"{len(kinds)} kind(s)  (* = required argument)", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("builtin")
    table.add_column("isolation")
    table.add_column("pools")
    table.add_column("services", justify="right")
    table.add_column("args")
    table.add_column("description")
    for k in kinds:
        table.add_row(
            cell(k["name"], "bold"),
            cell("yes" if k.get("builtin") else "no"),
            cell(k.get("isolation")),
            cell(", ".join(k.get("pools") or [])),
            cell(k.get("services")),
            cell("\n".join(args_lines(k.get("args_schema") or {}))),
            cell(k.get("description")),
        )
    return table


def args_lines(schema: JSON) -> list[str]:
    """``name*: type = default`` per property of a kind's args JSON Schema (a pydantic model)."""
    required = set(schema.get("required") or [])
    lines = []
    properties: dict[str, JSON] = schema.get("properties") or {}
    # Required first, then by name: the manager stores schemas as jsonb, which reorders keys.
    for name, prop in sorted(properties.items(), key=lambda item: (item[0] not in required, item[0])):
        line = f"{name}{'*' if name in required else ''}: {_schema_type(prop)}"
        if "default" in prop:
            line += f" = {_compact(prop['default'])}"
        lines.append(line)
    return lines


def _schema_type(prop: JSON) -> str:
    if "enum" in prop:
        return "|".join(_compact(v) for v in prop["enum"])
    if "type" in prop:
        return str(prop["type"])
    if "anyOf" in prop:  # pydantic's spelling of Optional[X] and unions
        return "|".join(_schema_type(p) for p in prop["anyOf"])
    if "$ref" in prop:
        return str(prop["$ref"]).rsplit("/", 1)[-1]
    return "any"


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else value


def watch_view(services: list[JSON], stats: JSON, error: str | None, refreshed_at: datetime) -> RenderableType:
    """What ``watch`` shows each refresh: one line of observer counts, capacity, and the services."""
    counts = stats.get("observers") or {}
    line = Text(f"{refreshed_at:%H:%M:%S}  observers: ")
    for status, count in counts.items():
        line.append(f"{status} ", STATUS_STYLES.get(status, ""))
        line.append(f"{count}  ", "bold")
    capacity = stats.get("capacity") or {}
    pools = Text("pools: ")
    for pool, c in capacity.items():
        pools.append(f"{pool} ", "bold")
        pools.append(f"{c['used']}/{c['total']} used  ")
    parts: list[RenderableType] = [line, pools, services_table(services)]
    if error:
        parts.append(Text(f"last refresh failed: {error}", style="bold red"))
    return Group(*parts)
