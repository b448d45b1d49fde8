"""The observer plug-in API.

An observer kind is a name, a pydantic model for its arguments and an async ``run(args,
ctx)`` that runs until cancelled::

    class EchoArgs(BaseModel):
        interval_s: float = 1.0

    async def run(args: EchoArgs, ctx: ObserverContext) -> None:
        while True:
            await asyncio.sleep(args.interval_s)
            ctx.ensure_lease()          # before every side effect (fencing)
            await ctx.emit({"hello": ctx.name})

    KIND = ObserverKind(name="echo", args_model=EchoArgs, run=run)

A plug-in package publishes its kinds in the entry-point group ``orchestrator.observers``
(``echo = "my_package.echo:KIND"``); every service discovers them at start (``shared.kinds``).

Rules for authors: never swallow ``asyncio.CancelledError`` (stop = cancel, with a bounded
grace); call ``ctx.ensure_lease()`` before anything with an effect outside the process and
let ``LeaseLost`` propagate; never block the event loop (it misses AMQP heartbeats and every
observer of the service fails over).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from shared.messages import Isolation, KindInfo

ArgsT = TypeVar("ArgsT", bound=BaseModel)


class ObserverContext(Protocol):
    """What a running observer gets from its service."""

    observer_id: uuid.UUID
    name: str
    kind: str
    service_id: uuid.UUID

    @property
    def stopping(self) -> asyncio.Event:
        """Set once the service tells the observer to stop (a body may wait on it)."""

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger that names the observer in every record."""

    def ensure_lease(self) -> None:
        """Raise ``LeaseLost`` unless this service still holds the observer's delivery on a
        live channel (confirmed by the broker within the last H/2 seconds) and the observer
        is not being stopped (``stopping`` set: a body that swallows cancellation can do
        nothing more, since its delivery is settled after the grace)."""

    async def emit(self, payload: dict[str, Any]) -> None:
        """Publish a persistent event to ``observers.events`` with routing key
        ``<kind>.<name>``; checks the lease first (so it is refused once stopping)."""


@dataclass(frozen=True)
class ObserverKind(Generic[ArgsT]):
    name: str
    args_model: type[ArgsT]
    run: Callable[[ArgsT, ObserverContext], Awaitable[None]]
    description: str = ""
    # ``async``: a task on the service's event loop (a few KiB each; must never block the
    # loop). ``process``: a child process supervised by the service (tens of MiB each; may
    # block, hog the CPU or crash without hurting its neighbours). Observers may override it.
    isolation: Isolation = "async"
    # False: its observers are pinned unless a create says otherwise, never moved to even the
    # load (a session that is costly to open, a source that limits reconnects). Drains still
    # move them.
    rebalance: bool = True
    # Narrows the args schema to what *this service* accepts (e.g. the modules ``periodic`` may
    # call here, from the service's environment). The service announces the narrowed schema
    # and the manager checks new observers against every schema announced in their pool, so
    # a service's own limits are answered with a 422 at create instead of a failure later.
    announce: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    @functools.cached_property
    def _info(self) -> KindInfo:
        return KindInfo(
            name=self.name,
            description=self.description,
            isolation=self.isolation,
            rebalance=self.rebalance,
            args_schema=self.args_model.model_json_schema(),
        )

    def info(self) -> KindInfo:
        """The kind as its code defines it, whatever the service (the manager's view of a
        built-in). Generated once: the manager asks for the built-ins' schemas on every
        catalog load."""
        return self._info

    def announced_info(self) -> KindInfo:
        """What this service announces (ServiceBorn, then ``GET /api/kinds``): ``info()``
        narrowed by ``announce`` when the kind has one. Not cached: ``announce`` may read the
        environment, and a service calls this once, at start."""
        if self.announce is None:
            return self._info
        return self._info.model_copy(update={"args_schema": self.announce(copy.deepcopy(self._info.args_schema))})

    def parse_args(self, raw: dict[str, Any]) -> ArgsT:
        """Validate raw JSON args; raises ``pydantic.ValidationError``."""
        return self.args_model.model_validate(raw)
