"""What every ``orchestrator`` command shares: the consoles, the client and options the
global callback sets (``State``), JSON output, and finding a service by name."""

from __future__ import annotations

import json
import os
import sys
import uuid
from dataclasses import dataclass

import typer
from rich.console import Console

from cli.client import JSON, Client, CliError


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    # Piped output (grep, scripts, tests) would be cut at rich's default 80 columns, which
    # ellipsizes names; 200 fits every table. A terminal (or $COLUMNS) keeps its own width.
    width = None if stream.isatty() or "COLUMNS" in os.environ else 200
    return Console(stderr=stderr, width=width)


out = console()
err = console(stderr=True)


@dataclass
class State:
    client: Client
    json_output: bool


def state_of(ctx: typer.Context) -> State:
    state = ctx.obj
    assert isinstance(state, State), "the callback sets ctx.obj before any command"
    return state


def print_json(body: JSON) -> None:
    print(json.dumps(body, indent=2))  # plain print: rich would wrap and colour it


def service_id(client: Client, value: str) -> str:
    """The API filters by service id; a name is friendlier, so resolve it (alive ones first)."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        pass
    for svc in client.get("/api/services"):  # the API lists alive services first
        if svc["name"] == value:
            return str(svc["id"])
    raise CliError(f"no service named {value!r} (see `orchestrator services`)")
