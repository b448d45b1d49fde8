"""An event loop on a thread of its own, and an ordered hand-over of calls between two loops.

The service runs its observers on the main thread's loop and holds its broker deliveries
on a second loop, on a second thread (``observer_service/holding.py`` says why). Nothing else
crosses between them but what goes through these two classes:

* ``LoopThread.call(coro)``: run a coroutine on the thread's loop and await its result from
  another loop (opening, closing, ``requeue_held``);
* ``Mailbox.post(fn, *args)``: call ``fn(*args)`` on a loop, soon and in posting order, from
  any thread. One wakeup serves every call posted until the loop gets to them, so a burst
  of 100,000 deliveries costs a handful of cross-thread wakeups, not 100,000.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from shared.event_loop import EventLoopChoice, loop_factory

logger = logging.getLogger(__name__)

T = TypeVar("T")


class LoopThread:
    """A daemon thread running an event loop of the process's kind (uvloop or asyncio)."""

    def __init__(self, name: str, choice: EventLoopChoice) -> None:
        self.loop = (loop_factory(choice) or asyncio.new_event_loop)()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
            # Whatever still runs is cancelled and given a chance to finish (connections'
            # reader and writer tasks), so the loop closes without "task was destroyed".
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this thread's loop; await it from the caller's loop. Cancelling
        the caller cancels it."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def stop(self, timeout_s: float = 10.0) -> None:
        with contextlib.suppress(RuntimeError):  # already stopped and closed
            self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self._thread.join, timeout_s)
        if self._thread.is_alive():
            logger.warning("thread %s did not stop within %.0fs", self._thread.name, timeout_s)


class Mailbox:
    """Calls posted from any thread, run on ``loop`` in posting order.

    The flag is cleared before the queue is drained, so a call posted while a drain runs is
    either taken by that drain or schedules the next one; it is never left behind."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._calls: collections.deque[tuple[Callable[..., object], tuple[Any, ...]]] = collections.deque()
        self._scheduled = False

    def post(self, fn: Callable[..., object], *args: Any) -> None:
        self._calls.append((fn, args))
        if not self._scheduled:
            self._scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is left to call
                self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        calls = self._calls
        while calls:
            fn, args = calls.popleft()
            try:
                fn(*args)
            except Exception:
                logger.exception("a call handed over from another thread failed: %r", fn)
