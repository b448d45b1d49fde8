"""What every ``orchestrator`` command shares: the consoles, the client and options the
global callback sets (``State``), and an answer printed as JSON or rendered."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import typer
from rich.console import Console, RenderableType

from cli.client import JSON, Client


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


def answer(state: State, body: JSON, view: Callable[[JSON], RenderableType]) -> None:
    """``body`` as JSON with ``--json``, else as ``view`` renders it."""
    if state.json_output:
        print_json(body)
    else:
        out.print(view(body))
