"""What the runner and observer tests share: a stand-in for a broker session and a wait."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from observer_service.lease import Lease


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
