"""The ``orchestrator`` commands (typer): thin wrappers that call the typed client
(``cli.client.Client``) and hand its answer, as JSON, to ``cli.render``. See ``cli/__init__.py`` for what
the package may import and the exit codes.
"""

from __future__ import annotations

import enum
import json
import sys
from typing import Annotated, Any

import typer
from rich.text import Text

from cli import fleet, render, times
from cli.client import Client, CliError
from cli.context import State, answer, err, out, print_json, state_of
from orchestrator_client import calls
from orchestrator_client.calls import observer_spec
from orchestrator_client.models import to_json

DEFAULT_URL = "http://127.0.0.1:8000"


# --- global options ---------------------------------------------------------------------


app = typer.Typer(
    name="orchestrator",
    help="Command line client of the observer orchestrator's manager API.",
    no_args_is_help=True,
    add_completion=False,
    # Tracebacks with locals would print the token; errors we expect never get here anyway.
    pretty_exceptions_show_locals=False,
)


def _check_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise typer.BadParameter(f"{value!r} is not an http(s) URL, e.g. {DEFAULT_URL}")
    return value


@app.callback()
def _global_options(
    ctx: typer.Context,
    url: Annotated[
        str, typer.Option(envvar="ORCH_URL", callback=_check_url, help="base URL of the manager")
    ] = DEFAULT_URL,
    token: Annotated[
        str | None,
        typer.Option(envvar="ORCH_TOKEN", show_default=False, help="API token, sent as 'Authorization: Bearer'"),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print the raw JSON answer, for scripts")] = False,
    timeout: Annotated[float, typer.Option(min=0.1, help="seconds to wait for each answer")] = 10.0,
    ca_file: Annotated[
        str | None,
        typer.Option(envvar="ORCH_CA_FILE", show_default=False, help="CA (PEM) of an https:// manager's certificate"),
    ] = None,
    retries: Annotated[
        int,
        typer.Option(
            min=0, max=20, help="times to send a request again after a 503 (its Retry-After) or a lost answer"
        ),
    ] = 2,
) -> None:
    client = Client(url, token, timeout, ca_file, retries)
    ctx.call_on_close(client.close)
    ctx.obj = State(client, json_output)


# --- commands ---------------------------------------------------------------------------


# The API's values, copied rather than imported: the client must not import the manager.
# tests/system/test_cli.py checks that they still equal the manager's own.


class Isolation(enum.StrEnum):
    ASYNC = "async"
    PROCESS = "process"


class Status(enum.StrEnum):
    SCHEDULED = "Scheduled"
    CREATED = "Created"
    PROCESSING = "Processing"
    ON_DELETING = "OnDeleting"
    DELETED = "Deleted"
    FAILED = "Failed"


class Sort(enum.StrEnum):
    CREATED = "created"
    ATTEMPTS = "attempts"


def _json_object(text: str | None, option: str) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise typer.BadParameter(f"not JSON: {e}", param_hint=option) from e
    if not isinstance(value, dict):
        raise typer.BadParameter("must be a JSON object {...}", param_hint=option)
    return value


def parse_args(pairs: list[str], args_json: str | None) -> dict[str, Any]:
    """``--args-json`` first, then each ``--arg key=value`` over it. A value is JSON when it
    parses (``5``, ``true``, ``[1,2]``, ``"5"``) and a plain string otherwise (``http://x``)."""
    args = _json_object(args_json, "--args-json")
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{pair!r} is not key=value", param_hint="--arg")
        try:
            args[key.strip()] = json.loads(raw)
        except ValueError:
            args[key.strip()] = raw
    return args


@app.command()
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="unique among live observers")],
    kind: Annotated[str, typer.Argument(help="see `orchestrator kinds`")],
    arg: Annotated[
        list[str] | None, typer.Option("--arg", "-a", help="key=value (value parsed as JSON when it parses)")
    ] = None,
    args_json: Annotated[str | None, typer.Option(help="all args as a JSON object; --arg overrides keys")] = None,
    pool: Annotated[str | None, typer.Option(help="pool to run in (the API's default: 'default')")] = None,
    retry_json: Annotated[
        str | None, typer.Option(help="retry policy fields to override, e.g. '{\"max_attempts\": null}'")
    ] = None,
    isolation: Annotated[Isolation | None, typer.Option(help="default: the kind's own")] = None,
    memory_limit_mb: Annotated[float | None, typer.Option(help="process isolation: kill above this RSS")] = None,
    start_at: Annotated[str | None, typer.Option(help="RFC 3339 with an offset, e.g. 2026-12-01T09:30:00Z")] = None,
    stop_at: Annotated[str | None, typer.Option(help="RFC 3339 with an offset: stopped then")] = None,
    run_for: Annotated[str | None, typer.Option(help="stopped this long after its start: 90, 15m, 2h, 1d")] = None,
    rebalance: Annotated[
        bool | None, typer.Option("--rebalance/--no-rebalance", help="--no-rebalance: pinned; default: the kind's own")
    ] = None,
) -> None:
    """Create an observer (Scheduled until --start-at, if given)."""
    state = state_of(ctx)
    body = observer_spec(
        name,
        kind,
        parse_args(arg or [], args_json),
        pool=pool,
        retry=_json_object(retry_json, "--retry-json") if retry_json is not None else None,
        isolation=isolation.value if isolation else None,
        memory_limit_mb=memory_limit_mb,
        run_for_s=times.seconds(run_for),
        rebalance=rebalance,
    )
    # The times go as typed: the API checks them (its 422 says what to fix).
    body |= {k: v for k, v in {"start_at": start_at, "stop_at": stop_at}.items() if v is not None}
    observer = to_json(state.client.send(calls.create(body)))
    if not state.json_output:
        out.print(Text("created", style="green"))
    answer(state, observer, render.observer_detail)


OBSERVERS = typer.Argument(metavar="NAME|ID", help="observer names, or full ids")


@app.command()
def stop(ctx: typer.Context, observers: Annotated[list[str], OBSERVERS]) -> None:
    """Stop observers (one: DELETE; several: one bulk-stop request)."""
    state = state_of(ctx)
    wanted = list(dict.fromkeys(observers))
    if len(wanted) == 1:
        observer = to_json(state.client.stop(wanted[0]))
        if state.json_output:
            return print_json(observer)
        out.print(Text(f"stopping {observer['name']} ({observer['id']}): {observer['status']}"))
        return None
    result = to_json(state.client.bulk_stop(wanted))
    if state.json_output:
        print_json(result)
    else:
        cancelled = len(result["cancelled"])  # Scheduled ones: Deleted, never started
        out.print(f"stopping {len(result['stopping'])}, cancelled {cancelled}, already final {len(result['final'])}")
    if result["unknown"]:
        # The single-id form answers 404 here; keep the same exit code for scripts.
        raise CliError(f"unknown ids: {' '.join(result['unknown'])}")
    return None


OBSERVER = typer.Argument(metavar="NAME|ID", help="the observer's name, or its full id")


@app.command()
def restart(ctx: typer.Context, observer: Annotated[str, OBSERVER]) -> None:
    """Give a Failed observer a fresh start."""
    state = state_of(ctx)
    restarted = to_json(state.client.restart(observer))
    if not state.json_output:
        out.print(Text("restarted", style="green"))
    answer(state, restarted, render.observer_detail)


@app.command("list")
def list_observers(
    ctx: typer.Context,
    status: Annotated[Status | None, typer.Option(case_sensitive=False)] = None,
    kind: str | None = None,
    pool: str | None = None,
    service: Annotated[str | None, typer.Option(help="service id or name")] = None,
    name: Annotated[str | None, typer.Option(help="exact name")] = None,
    search: Annotated[str | None, typer.Option(help="substring of the name, any case")] = None,
    sort: Annotated[Sort | None, typer.Option(help="created: oldest first; attempts: most first")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="observers per page")] = 100,
    all_pages: Annotated[bool, typer.Option("--all", help="follow the pages to the end")] = False,
    full_ids: Annotated[bool, typer.Option(help="show full ids instead of 8 digits")] = False,
) -> None:
    """List observers (oldest first, or --sort attempts), filtered by any of the options."""
    state = state_of(ctx)
    filters: dict[str, Any] = {
        "status": status.value if status else None,
        "kind": kind,
        "pool": pool,
        "service_id": state.client.service_id(service) if service else None,
        "name": name,
        "q": search,
        "sort": sort.value if sort else None,
    }
    items, cursor = state.client.send(calls.page(filters, limit, None))
    while all_pages and cursor:
        more, cursor = state.client.send(calls.page(filters, limit, cursor))
        items += more
    if state.json_output:
        return print_json({"items": to_json(items), "next_cursor": cursor})
    table = render.observers_table(to_json(items), full_ids)
    if cursor:
        table.caption = "more observers: add --all (or a larger --limit)"
    out.print(table)
    return None


@app.command()
def show(
    ctx: typer.Context,
    observer: Annotated[str, OBSERVER],
    events: Annotated[int, typer.Option(min=0, help="latest history events to show")] = 30,
) -> None:
    """One observer with its full id, and its history."""
    state = state_of(ctx)
    found = state.client.get(observer)
    history = to_json(state.client.events(found.id))  # oldest first: the latest are at the end
    if state.json_output:
        return print_json(to_json(found) | {"events": history})
    names = {str(s.id): s.name for s in state.client.services()} if history else {}
    out.print(render.observer_detail(to_json(found)))
    out.print(render.events_table(history, names, shown_from=max(0, len(history) - events)))
    return None


@app.command()
def stats(ctx: typer.Context) -> None:
    """Observers per status (and per kind), services per state, capacity per pool."""
    state = state_of(ctx)
    answer(state, to_json(state.client.stats()), render.stats_view)


@app.command()
def kinds(ctx: typer.Context) -> None:
    """Observer kinds the live services offer, with their arguments."""
    state = state_of(ctx)
    answer(state, to_json(state.client.kinds()), render.kinds_table)


for command in (fleet.services, fleet.drain, fleet.uncordon, fleet.watch):
    app.command()(command)


def main() -> None:
    try:
        app(prog_name="orchestrator")
    except CliError as e:
        err.print(Text(f"error: {e.message}", style="bold red"), soft_wrap=True)
        if e.hint:
            err.print(Text(f"hint: {e.hint}", style="yellow"), soft_wrap=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
