"""``ticker``: emits a tick every ``interval_s``. Enough for demos and tests; a template
for real kinds (lease check before every effect, cooperative cancellation).

Its args name nothing on the host, so an API caller cannot make it write to the service's
files (docs/threat-model.md); tests that need per-tick evidence use the test plug-in's
``probe`` kind instead."""

from __future__ import annotations

import asyncio
import random

from pydantic import BaseModel, ConfigDict, Field

from shared.observer_api import ObserverContext, ObserverKind


class TickerArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(default=1.0, gt=0, le=86_400)
    emit: bool = Field(default=True, description="publish each tick to observers.events")


async def run(args: TickerArgs, ctx: ObserverContext) -> None:
    tick = 0
    # A random phase: thousands of tickers started in one burst would otherwise all fire in
    # the same instant, every interval, and starve their service's event loop.
    await asyncio.sleep(random.uniform(0, args.interval_s))
    while True:
        tick += 1
        ctx.ensure_lease()
        if args.emit:
            await ctx.emit({"tick": tick})
        else:
            ctx.logger.debug("tick %d", tick)
        await asyncio.sleep(args.interval_s)


KIND: ObserverKind[TickerArgs] = ObserverKind(
    name="ticker", args_model=TickerArgs, run=run, description="emits a tick every interval_s"
)
