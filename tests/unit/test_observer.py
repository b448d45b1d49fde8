"""``observer_service.observer``: an ended observer freed by reference counting, observers
paused by a lapsed lease, a revoked lease met by a body."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid
import weakref
from types import SimpleNamespace

import pytest
from pydantic import BaseModel

from observer_service.lease import Lease
from observer_service.observer import Context, Running, _lease_back, supervise
from observer_service.outbox import Outbox
from observer_service.runner import Runner
from observer_service.settings import ServiceSettings
from shared.errors import LeaseLost
from shared.kinds import LoadedKind
from shared.observer_api import ObserverContext, ObserverKind
from tests.unit.fakes import FakeSession, until


class _NoArgs(BaseModel):
    pass


async def test_an_ended_observer_is_freed_by_reference_counting_alone() -> None:
    """Stopped observers must not wait for the collector (frozen by the GC policy, they
    would stay): the task that ran one, what ended it and the observer itself are freed
    by reference counting alone, whether its body was cancelled or raised."""
    runner = Runner.__new__(Runner)  # only _on_ended is exercised

    async def cancelled_body(args: object, ctx: object) -> None:
        await asyncio.sleep(3600)

    async def raising_body(args: object, ctx: object) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    # pytest keeps every log record, and the warning about the raising body carries its
    # traceback (and through it the observer): that logger is not what this test is about.
    logging.getLogger("observer.x").propagate = False
    for body in (cancelled_body, raising_body):
        loaded = LoadedKind(ObserverKind(name="x", args_model=_NoArgs, run=body), "tests:x")
        oid = uuid.uuid4()
        ctx = Context(oid, "x", "x", uuid.uuid4(), None)  # type: ignore[arg-type]
        running = Running(oid, b"{}", None, 1, None, ctx)  # type: ignore[arg-type]
        running.ended_by = "stop"
        settings = ServiceSettings()
        gc.disable()
        try:
            running.task = asyncio.create_task(
                supervise(running, loaded, _NoArgs(), settings, Outbox(), runner._on_ended)
            )
            await asyncio.sleep(0)
            if body is cancelled_body:
                running.task.cancel()
            for _ in range(3):
                await asyncio.sleep(0)
            assert running.task is None, "the task did not tell the runner it ended"
            ref = weakref.ref(running)
            del running
            assert ref() is None, f"an ended observer ({body.__name__}) is kept alive by a reference cycle"
        finally:
            gc.enable()


async def test_observers_paused_by_a_lapsed_lease_wait_on_it_without_a_timer_each() -> None:
    """A failover's burst of starts lapses the lease; every observer started meanwhile waits
    for it. They must wait on the lease, not poll it: 100,000 polling timers starved the loop
    that would read the renewal (a failover of 100,000 took 285 s)."""
    lease = Lease(heartbeat_s=0.2)
    lease.renew(time.monotonic() - 1)  # lapsed
    session = SimpleNamespace(closed=asyncio.Event(), lease=lease)

    def paused(count: int) -> list[asyncio.Task[None]]:
        contexts = [Context(uuid.uuid4(), "x", "x", uuid.uuid4(), session) for _ in range(count)]  # type: ignore[arg-type]
        return [asyncio.create_task(_lease_back(c)) for c in contexts]

    waiting = paused(1_000)
    await asyncio.sleep(0.3)
    assert not any(task.done() for task in waiting)
    assert len(asyncio.get_running_loop()._scheduled) < 100  # type: ignore[attr-defined]

    lease.renew(time.monotonic())  # renewed: all resume
    await asyncio.wait_for(asyncio.gather(*waiting), 5)

    lease = session.lease = Lease(heartbeat_s=0.2)  # the next session's lease: lapsed again
    lease.renew(time.monotonic() - 1)
    waiting = paused(100)
    await asyncio.sleep(0.05)
    session.closed.set()  # the session dies (Session.fail revokes the lease): all give up
    lease.revoke()
    results = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 5)
    assert all(isinstance(r, LeaseLost) for r in results)


async def test_an_observer_that_meets_a_revoked_lease_leaves_the_session_its_own_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The holding thread revokes the lease as soon as it finds the connection gone, and
    posts the session's end, with the broker's reason, to the main loop. An observer that
    meets the revoked lease first must not end the session itself: it did, with "observer X
    hit a lapsed lease" as an ERROR and as the session's reason (a service SIGSTOPped for
    20 s while 22,500 tickers emitted), blaming one observer for a closed connection."""
    lease = Lease(heartbeat_s=10)
    lease.renew(time.monotonic())
    session = FakeSession(lease)
    failed: list[str] = []
    session.fail = lambda reason, exc=None: failed.append(reason)  # type: ignore[attr-defined]
    runner = Runner.__new__(Runner)  # only _on_ended is exercised

    async def acting_body(args: object, ctx: ObserverContext) -> None:
        while True:
            ctx.ensure_lease()
            await asyncio.sleep(0.01)

    loaded = LoadedKind(ObserverKind(name="x", args_model=_NoArgs, run=acting_body), "tests:x")
    oid = uuid.uuid4()
    ctx = Context(oid, "x", "x", uuid.uuid4(), session)  # type: ignore[arg-type]
    running = Running(oid, b"{}", None, 1, session, ctx)  # type: ignore[arg-type]
    running.task = asyncio.create_task(
        supervise(running, loaded, _NoArgs(), ServiceSettings(), Outbox(), runner._on_ended)
    )
    await asyncio.sleep(0.05)
    with caplog.at_level(logging.INFO, logger="observer_service.runner"):
        lease.revoke()  # the connection is gone; the session's end is still on its way
        await until(lambda: running.task is None)
    assert failed == [] and "hit a lapsed lease" not in caplog.text, (failed, caplog.text)
