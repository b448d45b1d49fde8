"""Which event loop a process runs on (``ORCH_EVENT_LOOP``).

uvloop (libuv) runs the same asyncio code with a fraction of the loop's own overhead; the
manager and the services spend much of their time in that overhead (AMQP frames, HTTP,
timers of thousands of observers). ``asyncio`` keeps the standard loop, e.g. to rule uvloop
out when chasing a bug.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from typing import Literal

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]


def uses_uvloop(choice: EventLoopChoice) -> bool:
    if choice == "asyncio":
        return False
    if importlib.util.find_spec("uvloop") is not None:
        return True
    if choice == "uvloop":
        raise RuntimeError("ORCH_EVENT_LOOP=uvloop but uvloop is not installed (pip install uvloop)")
    return False


def loop_factory(choice: EventLoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """For ``asyncio.Runner(loop_factory=...)``; None means asyncio's default loop."""
    if not uses_uvloop(choice):
        return None
    import uvloop

    return uvloop.new_event_loop
