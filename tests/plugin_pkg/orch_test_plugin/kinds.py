"""Test kinds: a well-behaved plug-in (``echo``), a ticker that leaves evidence of every tick
(``probe``) and misbehaving ones for the runtime's retry, isolation and quarantine tests.
Each appends a line per run (``probe``: per tick) to ``log_file`` when given:
"<observer id> <service id> <pid> <unix time>", and ``probe`` a fifth field, a token of the run
(one start of the observer on one service), so each run's span of activity is known exactly.

Writing to a path named in the args is fine for a test plug-in and nothing else: whoever may
create observers picks the path (the built-in ``ticker`` lost its ``log_file`` for that)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from shared.observer_api import ObserverContext, ObserverKind


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")

    log_file: str | None = None


def _log_run(args: _Args, ctx: ObserverContext, run: str = "") -> None:
    if args.log_file:
        with Path(args.log_file).open("a", encoding="utf-8") as f:
            f.write(f"{ctx.observer_id} {ctx.service_id} {os.getpid()} {time.time():.6f} {run}".rstrip() + "\n")


class EchoArgs(_Args):
    message: str = Field(min_length=1, max_length=100)
    interval_s: float = Field(default=0.2, gt=0)


async def echo(args: EchoArgs, ctx: ObserverContext) -> None:
    _log_run(args, ctx)
    while True:
        await ctx.emit({"echo": args.message})
        await asyncio.sleep(args.interval_s)


class ProbeArgs(_Args):
    interval_s: float = Field(default=1.0, gt=0, le=86_400)
    emit: bool = Field(default=True, description="publish each tick to observers.events")


async def probe(args: ProbeArgs, ctx: ObserverContext) -> None:
    """The built-in ticker plus one line per tick in ``log_file``: which service acted when, the
    evidence of the failover and fencing tests (an observer never acts on two services at once)."""
    tick = 0
    run = uuid.uuid4().hex[:12]
    await asyncio.sleep(random.uniform(0, args.interval_s))  # a random phase, as the ticker
    while True:
        tick += 1
        ctx.ensure_lease()
        _log_run(args, ctx, run)  # one short O_APPEND write: lines of several services do not mix
        if args.emit:
            await ctx.emit({"tick": tick})
        await asyncio.sleep(args.interval_s)


class FlakyArgs(_Args):
    fail_runs: int = Field(default=2, ge=0, description="the first runs (per service) raise after fail_after_s")
    fail_after_s: float = Field(default=0.1, ge=0)


_runs: dict[str, int] = {}


async def flaky(args: FlakyArgs, ctx: ObserverContext) -> None:
    _log_run(args, ctx)
    run = _runs[str(ctx.observer_id)] = _runs.get(str(ctx.observer_id), 0) + 1
    await asyncio.sleep(args.fail_after_s)
    if run <= args.fail_runs:
        raise RuntimeError(f"flaky failure {run}")
    await asyncio.Event().wait()


class DelayArgs(_Args):
    delay_s: float = Field(default=1.0, ge=0)


async def service_killer(args: DelayArgs, ctx: ObserverContext) -> None:
    """Kills the process it runs in: its whole service in ``async`` isolation."""
    _log_run(args, ctx)
    await asyncio.sleep(args.delay_s)
    os.kill(os.getpid(), signal.SIGKILL)


async def crasher(args: DelayArgs, ctx: ObserverContext) -> None:
    _log_run(args, ctx)
    await asyncio.sleep(args.delay_s)
    os._exit(3)


async def cpu_hog(args: _Args, ctx: ObserverContext) -> None:
    """Blocks its event loop for good (a CPU-bound job written as if it were async)."""
    _log_run(args, ctx)
    while True:
        sum(range(100_000))


class MemoryArgs(_Args):
    mb_per_s: float = Field(default=100.0, gt=0)


async def memory_hog(args: MemoryArgs, ctx: ObserverContext) -> None:
    _log_run(args, ctx)
    hoard = []
    while True:
        hoard.append(bytearray(int(args.mb_per_s * 1024 * 1024 / 10)))
        await asyncio.sleep(0.1)


ECHO = ObserverKind(name="echo", args_model=EchoArgs, run=echo, description="emits its message every interval_s")
PROBE = ObserverKind(name="probe", args_model=ProbeArgs, run=probe, description="a ticker that logs every tick")
STICKY = ObserverKind(
    name="sticky", args_model=ProbeArgs, run=probe, description="a probe the balancer never moves", rebalance=False
)
FLAKY = ObserverKind(name="flaky", args_model=FlakyArgs, run=flaky, description="fails its first runs")
SERVICE_KILLER = ObserverKind(
    name="service_killer", args_model=DelayArgs, run=service_killer, description="kills its service"
)
CRASHER = ObserverKind(name="crasher", args_model=DelayArgs, run=crasher, description="os._exit(3)")
CPU_HOG = ObserverKind(name="cpu_hog", args_model=_Args, run=cpu_hog, description="burns CPU", isolation="process")
MEMORY_HOG = ObserverKind(
    name="memory_hog", args_model=MemoryArgs, run=memory_hog, description="eats memory", isolation="process"
)


class StubbornArgs(_Args):
    interval_s: float = Field(default=0.2, gt=0)


async def stubborn(args: StubbornArgs, ctx: ObserverContext) -> None:
    """Swallows cancellation (what plug-in authors are told never to do) and keeps ticking:
    one line per tick, written only after ``ensure_lease`` allowed it."""
    while True:
        try:
            ctx.ensure_lease()
            _log_run(args, ctx)
            await asyncio.sleep(args.interval_s)
        except asyncio.CancelledError:
            continue


STUBBORN = ObserverKind(
    name="stubborn", args_model=StubbornArgs, run=stubborn, description="ignores cancellation, ticks on"
)


async def deaf(args: StubbornArgs, ctx: ObserverContext) -> None:
    """Swallows cancellation and never asks its context before it acts: nothing but the end
    of its process ends it. One line per tick."""
    while True:
        try:
            _log_run(args, ctx)
            await asyncio.sleep(args.interval_s)
        except asyncio.CancelledError:
            continue


DEAF = ObserverKind(name="deaf", args_model=StubbornArgs, run=deaf, description="ignores cancellation and its fence")
