"""What the broker refuses this service for good, said clearly and not too often.

A refusal (a queue argument or type the broker rejects, a permission, the credentials, a
deprecated feature it denies) is not healed by retrying: the service retries anyway, in case
someone fixes it, but says so as one ERROR naming what to change, at most once a minute per
thing refused, instead of a WARNING with the broker's raw text at every attempt. A session
refused for only a few seconds is a WARNING: that is a broker rebuilding its virtual host. What is
refused now is in the service's metrics (``orch_service_refused``) and, for a pool whose
start queue alone is refused (the session is open), in its heartbeats, so the manager's
``GET /api/services`` and ``/readyz`` show it.
"""

from __future__ import annotations

import logging
import time

from observer_service import metrics

logger = logging.getLogger(__name__)

SAY_EVERY_S = 60.0
PASSING_S = 10.0  # a session refused for less long may be a broker being rebuilt


class Refusals:
    def __init__(self) -> None:
        self.pools: dict[str, str] = {}  # pool -> what the broker refuses about its start queue
        self.session: str | None = None  # why no session opens, when that is a refusal
        self._session_since: float | None = None  # refused without a break since
        self._said_at: dict[str, float] = {}
        metrics.REFUSED.set_function(lambda: len(self.pools) + (self.session is not None))

    def pool(self, pool: str, hint: str | None) -> None:
        """The holding connection's word on ``pool`` (``holding.RefusedHandler``)."""
        if hint is None:
            if self.pools.pop(pool, None) is not None:
                logger.info("the broker takes the start queue of pool %s again: consuming it", pool)
            return
        self.pools[pool] = hint
        self._say(f"pool {pool}", f"cannot consume pool {pool}: {hint}")

    def session_refused(self, hint: str) -> None:
        """A refused attempt to open a session. Refused for less than ``PASSING_S`` it is a
        WARNING, as any failed attempt: a virtual host refused for a moment is being made
        again (a broker that lost its data). Past that, an ERROR once a minute."""
        now = time.monotonic()
        if self._session_since is None:
            self._session_since = now
        self.session = hint
        if now - self._session_since < PASSING_S:
            metrics.REFUSALS.inc()
            logger.warning("cannot open a broker session: %s; retrying", hint)
        else:
            self._say("session", f"cannot open a broker session: {hint}")

    def session_opened(self) -> None:
        self.session = self._session_since = None

    def summary(self) -> str | None:
        """What heartbeats carry: each refused pool and why, in one line; None if nothing."""
        if not self.pools:
            return None
        return "; ".join(f"pool {pool}: {hint}" for pool, hint in sorted(self.pools.items()))

    def _say(self, key: str, line: str) -> None:
        metrics.REFUSALS.inc()
        now = time.monotonic()
        if now - self._said_at.get(key, -SAY_EVERY_S) >= SAY_EVERY_S:
            self._said_at[key] = now
            logger.error("%s (retrying; said again at most once a minute)", line)
        else:
            logger.debug("%s", line)
