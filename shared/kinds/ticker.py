"""``ticker``: emits a tick every ``interval_s``. Enough for demos and tests; a template
for real kinds (lease check before every effect, cooperative cancellation)."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from shared.observer_api import ObserverContext, ObserverKind


class TickerArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(default=1.0, gt=0, le=86_400)
    emit: bool = Field(default=True, description="publish each tick to observers.events")
    log_file: str | None = Field(
        default=None,
        description="append one line per tick (service id, pid, unix time) to this file; "
        "used to prove that an observer never acts on two hosts at once",
    )


def _append(path: str, line: str) -> None:
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(line)


async def run(args: TickerArgs, ctx: ObserverContext) -> None:
    tick = 0
    # A random phase: thousands of tickers started in one burst would otherwise all fire in
    # the same instant, every interval, and starve their service's event loop.
    await asyncio.sleep(random.uniform(0, args.interval_s))
    while True:
        tick += 1
        ctx.ensure_lease()
        if args.log_file:
            # One short write with O_APPEND is atomic enough for lines from several hosts.
            _append(args.log_file, f"{ctx.observer_id} {ctx.service_id} {os.getpid()} {time.time():.6f}\n")
        if args.emit:
            await ctx.emit({"tick": tick})
        else:
            ctx.logger.debug("tick %d", tick)
        await asyncio.sleep(args.interval_s)


KIND: ObserverKind[TickerArgs] = ObserverKind(
    name="ticker", args_model=TickerArgs, run=run, description="emits a tick every interval_s"
)
