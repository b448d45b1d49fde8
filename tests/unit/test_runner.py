"""``observer_service.runner``: starts wait for a lapsed lease and start once it is back."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from observer_service.inbox import REDELIVERED_START_DELAY_S
from observer_service.lease import Lease
from observer_service.outbox import Outbox
from observer_service.runner import Runner
from observer_service.settings import ServiceSettings
from shared.kinds import discover_kinds
from shared.messages import (
    StartObserver,
)
from tests.unit.fakes import FakeSession, deliver, inbox_for, until


async def test_starts_wait_for_a_lapsed_lease_then_start_once_it_is_back() -> None:
    """Deliveries that arrive while the lease is lapsed are not started until it is renewed:
    started, each observer only parked itself on the lease (an exception, a shielded waiter
    and a restart each), which made a failover on a saturated machine cost twice as much per
    start on the service's loop as the same failover on a quiet one. Once the lease is back
    they all start; the starts of a session that dies meanwhile are skipped."""
    lease = Lease(heartbeat_s=0.2)
    lease.renew(time.monotonic() - 1)  # lapsed
    session = FakeSession(lease)
    outbox = Outbox()
    runner = Runner(ServiceSettings(), uuid.uuid4(), outbox, {"idle": discover_kinds()["idle"]})

    inbox = inbox_for(runner)

    def deliver_many(count: int, to: FakeSession) -> None:
        for tag in range(count):
            body = StartObserver(observer_id=uuid.uuid4(), name=f"o{tag}", kind="idle").model_dump_json()
            deliver(inbox, body.encode(), tag, to)

    deliver_many(50, session)
    await asyncio.sleep(0.3)
    assert len(runner.running) == 0 and len(outbox) == 0, "started (and reported) while the lease was lapsed"

    lease.renew(time.monotonic())
    await until(lambda: len(runner.running) == 50)
    await asyncio.sleep(0.05)
    assert lease._change is None, "a started observer is parked on the lease"
    assert len(outbox) == 50

    lapsed = Lease(heartbeat_s=0.2)  # the next session's lease: lapsed again
    lapsed.renew(time.monotonic() - 1)
    gone = FakeSession(lapsed)
    deliver_many(20, gone)
    await asyncio.sleep(0.05)
    assert inbox.draining  # waiting for the lease
    gone.closed.set()  # the session dies (Session.fail revokes the lease too)
    lapsed.revoke()
    await until(lambda: not inbox.draining)
    assert len(runner.running) == 50, "a start of a dead session was started"
    session.closed.set()  # the end of the first session ends its observers quietly
    for running in list(runner.running.values()):
        assert running.task is not None
        running.task.cancel()
    await asyncio.sleep(0.05)


async def test_a_redelivered_start_waits_for_the_old_holder_to_hear_of_its_close() -> None:
    """The broker requeues a closed connection's starts before it tells that service
    (docs/design.md, invariant 2): a redelivered start begins only
    ``REDELIVERED_START_DELAY_S`` after it arrived, and the first delivery behind it waits
    in order; a first delivery begins at once."""
    lease = Lease(heartbeat_s=10)
    lease.renew(time.monotonic())
    session = FakeSession(lease)
    runner = Runner(ServiceSettings(), uuid.uuid4(), Outbox(), {"idle": discover_kinds()["idle"]})
    inbox = inbox_for(runner)

    def body(name: str) -> bytes:
        return StartObserver(observer_id=uuid.uuid4(), name=name, kind="idle").model_dump_json().encode()

    deliver(inbox, body("first"), 1, session)
    await until(lambda: len(runner.running) == 1)

    arrived = time.monotonic()
    deliver(inbox, body("moved"), 2, session, redelivered=True)
    deliver(inbox, body("behind"), 3, session)
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(runner.running) == 1, "a redelivered start began as soon as it arrived"
    await until(lambda: len(runner.running) == 3)
    assert time.monotonic() - arrived >= REDELIVERED_START_DELAY_S
    session.closed.set()
    for running in list(runner.running.values()):
        assert running.task is not None
        running.task.cancel()
    await asyncio.sleep(0.05)


async def test_a_hand_over_is_reported_before_its_starts_go_back() -> None:
    """A start given back may come straight back to this service (issue 62, item 4): its new
    start report must follow the hand-over report in the outbox, or the manager applies the
    hand-over last and takes the copy running here off this service."""
    lease = Lease(heartbeat_s=10)
    lease.renew(time.monotonic())
    session = FakeSession(lease)
    outbox = Outbox()
    runner = Runner(ServiceSettings(), uuid.uuid4(), outbox, {"idle": discover_kinds()["idle"]})
    ids = [uuid.uuid4() for _ in range(3)]
    inbox = inbox_for(runner)
    for tag, oid in enumerate(ids):
        body = StartObserver(observer_id=oid, name=f"o{tag}", kind="idle").model_dump_json()
        deliver(inbox, body.encode(), tag, session)
    await until(lambda: len(runner.running) == 3)

    happened: list[str] = []
    put = outbox.put

    def recorded_put(message: Any, session: object | None = None) -> None:
        happened.append(type(message).__name__)
        put(message, session)

    outbox.put = recorded_put  # type: ignore[method-assign]

    async def requeue(channel: object, tag: int) -> None:
        happened.append(f"requeue {tag}")

    session.requeue = requeue  # type: ignore[attr-defined]
    await runner.hand_over(ids, None, "even load")
    assert happened == ["ObserversHandedOver", "requeue 0", "requeue 1", "requeue 2"]
