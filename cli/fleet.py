"""The commands about the fleet rather than one observer: the services, draining one, and
watching them; registered on the ``orchestrator`` app by ``cli/main.py``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated

import typer
from rich.live import Live
from rich.text import Text

from cli import render
from cli.client import JSON, Client, CliError
from cli.context import answer, out, print_json, state_of
from orchestrator_client.models import to_json


def services(ctx: typer.Context) -> None:
    """Observer services, alive first, with running counts and heartbeat ages."""
    state = state_of(ctx)
    answer(state, to_json(state.client.services()), render.services_table)


def drain(ctx: typer.Context, service: Annotated[str, typer.Argument(metavar="NAME|ID")]) -> None:
    """Stop a service taking new starts and hand its observers to the others, at a bounded
    rate; `orchestrator services` shows how it goes ("drained": it may be stopped)."""
    _set_draining(ctx, service, "drain")


def uncordon(ctx: typer.Context, service: Annotated[str, typer.Argument(metavar="NAME|ID")]) -> None:
    """End a drain: the service takes new starts again."""
    _set_draining(ctx, service, "uncordon")


def _set_draining(ctx: typer.Context, service: str, action: str) -> None:
    state = state_of(ctx)
    body = to_json(state.client.drain(service) if action == "drain" else state.client.uncordon(service))
    if state.json_output:
        print_json(body)
    else:
        out.print(Text(f"{body['name']}: {body['drain_note'] or 'takes new starts'}"))


def watch(
    ctx: typer.Context,
    interval: Annotated[float, typer.Option(min=0.1, help="seconds between refreshes")] = 2.0,
    iterations: Annotated[int | None, typer.Option(min=1, help="stop after this many refreshes")] = None,
) -> None:
    """Services and observer counts, refreshed until Ctrl-C (with --json: one JSON line per refresh)."""
    state = state_of(ctx)
    refreshes = _refreshes(state.client, interval, iterations)
    try:
        if state.json_output:
            for services_body, stats_body, error in refreshes:
                line = {"services": services_body, "stats": stats_body} if error is None else {"error": error}
                print(json.dumps(line), flush=True)
            return
        if not out.is_terminal:
            # A pipe or a file cannot be redrawn (rich would print only the last view, at
            # the end): print each refresh after the previous one instead.
            for i, refresh in enumerate(refreshes):
                if i:
                    out.line()
                out.print(render.watch_view(*refresh, datetime.now()))
            return
        first = next(refreshes)
        # No auto refresh: the screen changes only when there is new data.
        with Live(render.watch_view(*first, datetime.now()), console=out, auto_refresh=False) as live:
            for refresh in refreshes:
                live.update(render.watch_view(*refresh, datetime.now()), refresh=True)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a watch ends: not an error


def _refreshes(client: Client, interval: float, iterations: int | None) -> Iterator[tuple[JSON, JSON, str | None]]:
    """(services, stats, error) per refresh. The first fetch may fail with its exit code (a
    wrong URL or token should not look like a blank screen); later failures, such as a
    manager restart, are shown while the last data stays on screen."""
    services_body, stats_body = to_json(client.services()), to_json(client.stats())
    yield services_body, stats_body, None
    done = 1
    while iterations is None or done < iterations:
        time.sleep(interval)
        done += 1
        try:
            services_body, stats_body = to_json(client.services()), to_json(client.stats())
            error = None
        except CliError as e:
            error = e.message
        yield services_body, stats_body, error
