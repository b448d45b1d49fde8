"""One running observer: its context (what the body sees), its state in the service, and the
supervisor that runs its body and restarts it in place under its retry policy."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from observer_service import metrics
from observer_service.isolation import ProcessLimits, run_in_process
from observer_service.outbox import Outbox
from observer_service.session import Session
from observer_service.settings import ServiceSettings
from observer_service.settle_queue import DeliveryChannel
from shared.errors import LeaseLost
from shared.kinds import LoadedKind
from shared.messages import ObserverRetrying, RetryPolicy, StartObserver, decode_start, utcnow

MAX_ERROR_CHARS = 2000


class Context:
    """The ``ObserverContext`` handed to an observer body.

    Slotted, and ``stopping`` and ``logger`` are made only when asked for: a service holds
    hundreds of thousands of these, and an ``asyncio.Event`` is a sizeable part of one
    (docs/design.md, "What grows with the fleet", density)."""

    __slots__ = ("_session", "_stop_requested", "_stopping", "kind", "name", "observer_id", "service_id")

    def __init__(self, observer_id: uuid.UUID, name: str, kind: str, service_id: uuid.UUID, session: Session) -> None:
        self.observer_id = observer_id
        self.name = name
        self.kind = kind
        self.service_id = service_id
        self._session = session
        self._stop_requested = False
        self._stopping: asyncio.Event | None = None

    @property
    def stopping(self) -> asyncio.Event:
        if self._stopping is None:
            self._stopping = asyncio.Event()
            if self._stop_requested:
                self._stopping.set()
        return self._stopping

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        return logging.LoggerAdapter(logging.getLogger(f"observer.{self.kind}"), {"observer_id": str(self.observer_id)})

    def fresh(self) -> Context:
        """The same observer's context, not stopping: for a run that follows one which was
        fenced by ``request_stop`` (probation's move into a child, ``probation.py``)."""
        return Context(self.observer_id, self.name, self.kind, self.service_id, self._session)

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def request_stop(self) -> None:
        """Tell the body to stop (``stopping``); from now on it may not act (``ensure_lease``)."""
        self._stop_requested = True
        if self._stopping is not None:
            self._stopping.set()

    def lease_deadline(self) -> float:
        """Monotonic instant until which this observer's service holds its delivery (0 once its
        session is gone). A process observer's child acts until this deadline; its stop is
        bounded by a grace shorter than the service's, so it ends before the delivery is
        settled."""
        return 0.0 if self._session.closed.is_set() else self._session.lease.valid_until()

    async def lease_changed(self) -> None:
        """Until the lease is renewed or revoked (``Lease.changed``)."""
        await self._session.lease.changed()

    def ensure_lease(self) -> None:
        if self._session.closed.is_set():
            raise LeaseLost("the broker session of this observer is gone")
        if self._stop_requested:
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


class Running:
    """One observer this service runs: what it needs to run it and to settle its delivery.

    Kept small on purpose (docs/design.md, "What grows with the fleet", density): the start
    message stays as the bytes it came in (decoded again only when needed: a retry policy
    after a failure, a move into a child process, a describe), and the delivery as its tag on
    the session's channel, instead of the decoded model and aio-pika's message."""

    __slots__ = (
        "__weakref__",
        "body",
        "channel",
        "ctx",
        "ended_by",
        "isolating",
        "isolation",
        "observer_id",
        "session",
        "started_at",
        "tag",
        "task",
    )

    def __init__(
        self, observer_id: uuid.UUID, body: bytes, channel: DeliveryChannel, tag: int, session: Session, ctx: Context
    ) -> None:
        self.observer_id = observer_id
        self.body = body
        self.channel = channel  # the channel its start was delivered on, and the delivery tag there
        self.tag = tag
        self.session = session
        self.ctx = ctx
        self.task: asyncio.Task[None] | None = None
        # Set when the service ends the task on purpose; a task that ends without it failed.
        self.ended_by: str | None = None
        self.started_at = time.monotonic()
        self.isolation = "async"
        # Being moved into a child process (probation): its task is cancelled on purpose.
        self.isolating = False

    def start(self) -> StartObserver:
        return decode_start(self.body)


class ObserverGaveUp(Exception):
    """The retry policy is exhausted."""


OnEnded = Callable[["Running", BaseException | None], None]


async def supervise(
    running: Running,
    loaded: LoadedKind,
    args: BaseModel,
    settings: ServiceSettings,
    outbox: Outbox,
    on_ended: OnEnded,
) -> None:
    """Run the observer's body and restart it in place, under its retry policy, each
    time it returns or raises. Cancellation (stop, handoff, fence) ends it for good; so
    does giving up (``ObserverGaveUp``: Failed, dead-lettered). A body stopped by a lapsed
    lease while its session lives waits for the lease and starts again, uncounted (see
    ``Session._lease_loop``); once the session is gone, ``LeaseLost`` ends it.

    However it ends, the task itself tells the runner last: ``on_ended(running, what ended
    it)`` (a ``CancelledError`` if cancelled, None if it was ended on purpose and returned).
    A done-callback would cost one more object per observer, and the body runs in this same
    frame rather than in a helper coroutine for the same reason (docs/design.md, density)."""
    ctx = running.ctx
    policy: RetryPolicy | None = None  # decoded from the start message at the first failure
    failures = 0
    outcome: BaseException | None = None
    try:
        while True:
            began = time.monotonic()
            try:
                if running.isolation == "process":
                    await _run_in_child(running, loaded, args, settings)
                else:
                    await loaded.kind.run(args, ctx)
                error = "observer returned"
            except LeaseLost:
                if ctx.lease_deadline() == 0.0 or running.ended_by is not None or ctx.stop_requested:
                    raise
                await _lease_back(ctx)
                continue
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
                ctx.logger.warning("observer %s ended with %s", running.observer_id, error, exc_info=True)
            if running.ended_by is not None:
                return  # ended on purpose while it was ending anyway
            if ctx.lease_deadline() == 0.0:
                raise LeaseLost(f"its session is gone (the body ended with {error})")
            if policy is None:
                policy = running.start().retry
            if time.monotonic() - began >= policy.reset_after_s:
                failures = 0
            failures += 1
            if policy.gives_up(failures):
                raise ObserverGaveUp(f"gave up after {failures} attempt(s) in a row; last: {error}")
            delay = policy.delay_s(failures, random.uniform(-1, 1))
            metrics.RESTARTS.inc()
            outbox.put(
                ObserverRetrying(
                    observer_id=running.observer_id,
                    service_id=ctx.service_id,
                    attempt=failures + 1,
                    error=error[:MAX_ERROR_CHARS],
                    delay_s=round(delay, 3),
                )
            )
            await asyncio.sleep(delay)
    except (Exception, asyncio.CancelledError) as e:  # noqa: BLE001 - handed to the runner, which reports it
        outcome = e
    finally:
        try:
            on_ended(running, outcome)
        finally:
            # The exception's traceback holds this frame, whose locals hold the exception:
            # dropped here, reference counting frees both (no cycle left for the collector).
            outcome = None


async def _lease_back(ctx: Context) -> None:
    """Until the lease is valid again; raises ``LeaseLost`` if the session dies meanwhile
    (its end revokes the lease, which wakes this)."""
    while True:
        deadline = ctx.lease_deadline()
        if deadline == 0.0:
            raise LeaseLost("the broker session of this observer is gone")
        if deadline > time.monotonic():
            return
        await ctx.lease_changed()


async def _run_in_child(running: Running, loaded: LoadedKind, args: BaseModel, settings: ServiceSettings) -> None:
    limits = ProcessLimits(
        memory_limit_mb=running.start().memory_limit_mb,
        liveness_timeout_s=settings.process_liveness_timeout_s,
        # Inside the service's own grace, so the child is gone before the delivery is settled.
        stop_grace_s=settings.stop_grace_s * 0.8,
    )
    await run_in_process(loaded.ref, args.model_dump(mode="json"), running.ctx, limits)
