"""The log lines of the observers a service starts: the first few of every second one by one,
the rest counted in one line.

A failover or a reconnect hands a service thousands of starts a second, and at the default
``INFO`` level a line costs the main loop about half as much as the rest of a start. A window
of time bounds the lines whatever the runner's drains look like (they come a few dozen at a
time, so a limit per drain is not enough): at most ``each`` start lines and one count per
``window_s`` (figures: docs/design.md, "Where the time goes"). ``DEBUG`` logs every start;
the manager's history records where each observer started.
"""

from __future__ import annotations

import asyncio
import logging
import time

logger = logging.getLogger(__name__)


class StartLog:
    def __init__(self, each: int = 10, window_s: float = 1.0) -> None:
        self.each = each
        self.window_s = window_s
        self._window_began: float | None = None
        self._in_window = 0
        self._held_back = 0
        self._closing: asyncio.TimerHandle | None = None

    def level(self) -> int:
        """The level of the next start's line (``INFO`` or ``DEBUG``). Called on the loop
        that runs the observers, once per observer started."""
        now = time.monotonic()
        if self._window_began is not None and now - self._window_began >= self.window_s:
            self.close()  # its timer is late: the loop was busy starting
        if self._window_began is None:
            self._window_began, self._in_window = now, 0
        self._in_window += 1
        if self._in_window <= self.each:
            return logging.INFO
        self._held_back += 1
        if self._closing is None:
            delay = max(0.0, self._window_began + self.window_s - now)
            self._closing = asyncio.get_running_loop().call_later(delay, self.close)
        return logging.DEBUG

    def close(self) -> None:
        """End the window: one line counts the starts it did not log one by one."""
        if self._closing is not None:
            self._closing.cancel()
            self._closing = None
        if self._held_back and self._window_began is not None:
            logger.info(
                "started %d more observer(s) in the last %.1fs; only the first %d of every %gs are logged one by one "
                "(DEBUG logs each)",
                self._held_back,
                time.monotonic() - self._window_began,
                self.each,
                self.window_s,
            )
        self._window_began, self._in_window, self._held_back = None, 0, 0
