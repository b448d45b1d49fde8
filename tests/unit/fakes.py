"""What the runner and observer tests share: a stand-in for a broker session, the inbox a
service feeds a runner through, and a wait."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from observer_service.inbox import Delivery, Inbox
from observer_service.lease import Lease
from observer_service.runner import Runner


class FakeSession:
    """What the runner reads of a session: whether it is gone, its lease, its id (hashable:
    the held observers are counted per session)."""

    def __init__(self, lease: Lease) -> None:
        self.closed = asyncio.Event()
        self.lease = lease
        self.id = uuid.uuid4()


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def inbox_for(runner: Runner) -> Inbox:
    """The inbox a service hands its start deliveries to, admitting them into ``runner``, as
    ``ObserverService`` makes it."""
    return Inbox(runner.outbox, runner.gc, runner.admit, runner.spawn)


def deliver(
    inbox: Inbox, start: bytes, tag: int, session: FakeSession, headers: Any = None, *, redelivered: bool = False
) -> None:
    """One start delivery, as the holding connection hands it to the service, received now."""
    delivery = Delivery(start, None, tag, redelivered, session, headers=headers, received_at=time.monotonic())  # type: ignore[arg-type]
    inbox.put(delivery)
