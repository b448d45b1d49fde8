"""``idle``: holds its worker and does nothing until it is stopped: no timer, no emit, no
connection. For capacity checks and benchmarks (``make bench-scale`` measures what an
observer costs the system when its own work costs nothing)."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, ConfigDict

from shared.observer_api import ObserverContext, ObserverKind


class IdleArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


async def run(args: IdleArgs, ctx: ObserverContext) -> None:
    ctx.ensure_lease()
    await asyncio.Future()  # cancelled by its stop (or its session's end), never resolved


KIND: ObserverKind[IdleArgs] = ObserverKind(
    name="idle", args_model=IdleArgs, run=run, description="holds its worker and does nothing until stopped"
)
