"""Functions the ``periodic`` kind calls in the tests (imported by the service processes,
which run with the repository as their working directory)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any


def _append(path: str, line: str) -> None:
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(line + "\n")


async def record(ctx: Any, path: str, sleep_s: float = 0.0) -> str:
    """One line per call: "<service id> <start> <end>" (unix times), written at its end."""
    start = time.time()
    await asyncio.sleep(sleep_s)
    end = time.time()
    ctx.ensure_lease()
    _append(path, f"{ctx.service_id} {start:.6f} {end:.6f}")
    return f"{start:.6f}"


async def sleepy(ctx: Any, path: str, sleep_s: float) -> None:
    """Sleeps ``sleep_s``; writes "start" when called and "cancelled" if it is cancelled."""
    _append(path, "start")
    try:
        await asyncio.sleep(sleep_s)
    except asyncio.CancelledError:
        _append(path, "cancelled")
        raise
    _append(path, "finished")


async def hog_loop(ctx: Any, seconds: float, path: str) -> None:
    """Keeps the service's event loop busy for ``seconds`` without ever yielding, as a loop
    with more observer work than it can run is; writes "start" and "end"."""
    _append(path, "start")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass
    _append(path, "end")


def add(ctx: Any, a: int, b: int) -> int:
    """A plain sync function (runs in a worker thread)."""
    return a + b


def block(ctx: Any, sleep_s: float) -> None:
    time.sleep(sleep_s)


def fail(ctx: Any, message: str = "boom") -> None:
    raise ValueError(message)


async def opaque(ctx: Any) -> object:
    """Returns something that is not JSON (emitted as its repr)."""
    return {1, 2}


NOT_A_FUNCTION = 42
