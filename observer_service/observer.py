"""One running observer: its context (what the body sees), its state in the service, and the
supervisor that runs its body and restarts it in place under its retry policy."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aio_pika.abc import AbstractIncomingMessage
from pydantic import BaseModel

from observer_service import metrics
from observer_service.isolation import ProcessLimits, run_in_process
from observer_service.outbox import Outbox
from observer_service.session import Session
from shared.errors import LeaseLost
from shared.kinds import LoadedKind
from shared.messages import ObserverRetrying, StartObserver, utcnow
from shared.settings import ServiceSettings

MAX_ERROR_CHARS = 2000
_LEASE_POLL_S = 0.1


class Context:
    """The ``ObserverContext`` handed to an observer body."""

    def __init__(self, start: StartObserver, service_id: uuid.UUID, session: Session) -> None:
        self.observer_id = start.observer_id
        self.name = start.name
        self.kind = start.kind
        self.service_id = service_id
        self.stopping = asyncio.Event()
        self.logger = logging.LoggerAdapter(
            logging.getLogger(f"observer.{start.kind}"), {"observer_id": str(start.observer_id)}
        )
        self._session = session

    def lease_deadline(self) -> float:
        """Monotonic instant until which this observer's host holds its delivery (0 once its
        session is gone). A process observer's child acts until this deadline; its stop is
        bounded by a grace shorter than the service's, so it ends before the delivery is
        settled."""
        return 0.0 if self._session.closed.is_set() else self._session.lease.valid_until()

    def ensure_lease(self) -> None:
        if self._session.closed.is_set():
            raise LeaseLost("the broker session of this observer is gone")
        if self.stopping.is_set():
            # A body that swallows CancelledError must not act on: once the grace is over
            # its start is acked (stop) or handed back (handoff) and may run elsewhere.
            raise LeaseLost("the observer is stopping: no more side effects")
        self._session.lease.ensure()

    async def emit(self, payload: dict[str, Any]) -> None:
        self.ensure_lease()
        body = {
            "observer_id": str(self.observer_id),
            "name": self.name,
            "kind": self.kind,
            "service_id": str(self.service_id),
            "time": utcnow().isoformat(),
            "payload": payload,
        }
        await self._session.emit_event(f"{self.kind}.{self.name}", json.dumps(body).encode())
        metrics.EMITS.inc()


@dataclass(eq=False)
class Running:
    start: StartObserver
    message: AbstractIncomingMessage
    session: Session
    ctx: Context
    task: asyncio.Task[None] | None = None
    # Set when the service ends the task on purpose; a task that ends without it failed.
    ended_by: str | None = None
    started_at: float = field(default_factory=time.monotonic)
    isolation: str = "async"
    # Being moved into a child process (probation): its task is cancelled on purpose.
    isolating: bool = False


class ObserverGaveUp(Exception):
    """The retry policy is exhausted."""


async def supervise(
    running: Running, loaded: LoadedKind, args: BaseModel, settings: ServiceSettings, outbox: Outbox
) -> None:
    """Run the observer's body and restart it in place, under its retry policy, each
    time it returns or raises. Cancellation (stop, handoff, fence) ends it for good; so
    does giving up (``ObserverGaveUp``: Failed, dead-lettered). A body stopped by a lapsed
    lease while its session lives waits for the lease and starts again, uncounted (see
    ``Session._lease_loop``); once the session is gone, ``LeaseLost`` propagates."""
    start, ctx = running.start, running.ctx
    policy = start.retry
    failures = 0
    while True:
        began = time.monotonic()
        try:
            await _run_body(running, loaded, args, settings)
            error = "observer returned"
        except LeaseLost:
            if ctx.lease_deadline() == 0.0 or running.ended_by is not None:
                raise
            await _lease_back(ctx)
            continue
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            ctx.logger.warning("observer %s ended with %s", start.observer_id, error, exc_info=True)
        if running.ended_by is not None:
            return  # ended on purpose while it was ending anyway
        if ctx.lease_deadline() == 0.0:
            raise LeaseLost(f"its session is gone (the body ended with {error})")
        if time.monotonic() - began >= policy.reset_after_s:
            failures = 0
        failures += 1
        if policy.gives_up(failures):
            raise ObserverGaveUp(f"gave up after {failures} attempt(s) in a row; last: {error}")
        delay = policy.delay_s(failures, random.uniform(-1, 1))
        metrics.RESTARTS.inc()
        outbox.put(
            ObserverRetrying(
                observer_id=start.observer_id,
                service_id=ctx.service_id,
                attempt=failures + 1,
                error=error[:MAX_ERROR_CHARS],
                delay_s=round(delay, 3),
            )
        )
        await asyncio.sleep(delay)


async def _lease_back(ctx: Context) -> None:
    """Until the lease is valid again; raises ``LeaseLost`` if the session dies meanwhile."""
    while True:
        deadline = ctx.lease_deadline()
        if deadline == 0.0:
            raise LeaseLost("the broker session of this observer is gone")
        if deadline > time.monotonic():
            return
        await asyncio.sleep(_LEASE_POLL_S)


async def _run_body(running: Running, loaded: LoadedKind, args: BaseModel, settings: ServiceSettings) -> None:
    start = running.start
    if running.isolation == "process":
        limits = ProcessLimits(
            memory_limit_mb=start.memory_limit_mb,
            liveness_timeout_s=settings.process_liveness_timeout_s,
            # Inside the service's own grace, so the child is gone before the delivery is settled.
            stop_grace_s=settings.stop_grace_s * 0.8,
        )
        await run_in_process(loaded.ref, args.model_dump(mode="json"), running.ctx, limits)
    else:
        await loaded.kind.run(args, running.ctx)
