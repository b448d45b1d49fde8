"""How every loop that retries a dependency (the database, the broker) says it cannot reach it.

One line when the outage begins, one a minute while it lasts (how long, how many attempts,
why the last one failed), one when it ends: a WARNING per attempt would be a line a second
per loop, thousands in an hour's outage. The attempts in between are DEBUG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class OutageLog:
    """``down`` names the outage ("applying state reports: the database is unavailable or
    busy"), ``up`` its end ("... the database answers again"); every line starts with one of
    them, so an operator greps for either."""

    def __init__(
        self,
        log: logging.Logger,
        down: str,
        up: str,
        *,
        every_s: float = 60.0,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        self.log = log
        self.down = down
        self.up = up
        self.every_s = every_s
        self.on_failure = on_failure  # told of every failure (the leader lock checks itself at once)
        self._since: float | None = None  # monotonic time of the first failure, None while it works
        self._said_at = 0.0
        self._failures = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    @property
    def failures(self) -> int:
        """Failures since the outage began (0 while it works)."""
        return self._failures

    def failed(self, why: str) -> None:
        now = time.monotonic()
        self._failures += 1
        if self.on_failure is not None:
            self.on_failure()
        if self._since is None:
            self._since = self._said_at = now
            self.log.warning("%s (%s); retrying", self.down, why)
        elif now - self._said_at >= self.every_s:
            self._said_at = now
            self.log.warning(
                "%s (%s): %d failed attempt(s) in %.0fs; retrying", self.down, why, self._failures, now - self._since
            )
        else:
            self.log.debug("%s (%s)", self.down, why)

    def worked(self, detail: str = "") -> None:
        """The dependency answers again; ``detail`` ends the line (", at rabbit@host")."""
        if self._since is None:
            return
        self.log.info(
            "%s after %.0fs and %d failed attempt(s)%s",
            self.up,
            time.monotonic() - self._since,
            self._failures,
            detail,
        )
        self._since, self._failures = None, 0
