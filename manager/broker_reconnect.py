"""How the manager's broker connection comes back, and what it says meanwhile.

aio-pika retries a lost robust connection at a fixed ``reconnect_interval``: a long one
leaves the manager down up to that long after the broker is back, a short one hammers the
broker and the log through a long outage. So ``Reconnects`` paces the attempts as a
service's are paced (``shared.backoff``): a blip costs a fraction of a second, a long outage
one attempt every 2.5 to 5 s. On a cluster each attempt goes to the next node. The outage is
said as every loop that retries says one (``shared.outage``): when it begins, each minute,
when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from aio_pika.abc import AbstractRobustConnection
from yarl import URL

from shared.amqp_errors import describe_close, describe_connect_failure, vhost_refused, vhost_refused_text
from shared.backoff import backoff_delay
from shared.broker_nodes import BrokerNodes, node_name
from shared.logs import chatter_count, last_chatter
from shared.outage import OutageLog
from shared.settings import amqp_url_with_heartbeat

logger = logging.getLogger(__name__)

RECONNECT_FIRST_S = 0.2
_RECONNECT_MAX_S = 5.0


def reconnect_interval(attempts: int, spread: float | None = None) -> float:
    """Seconds until the next attempt to reconnect, after ``attempts`` failed ones: the
    services' backoff from ``RECONNECT_FIRST_S`` to ``_RECONNECT_MAX_S``, to a hundredth
    (aio-pika's log line for each attempt prints it as it is)."""
    return round(backoff_delay(attempts, RECONNECT_FIRST_S, _RECONNECT_MAX_S, spread), 2)


def _reason(exc: BaseException | None, heartbeat_s: int) -> str:
    """Why a connection closed, in a line: the broker's reply (``CONNECTION_FORCED - ...``),
    the socket's error, or no frame for the heartbeat's grace (``describe_close``)."""
    if exc is None:
        return "no reason given"
    if isinstance(exc, asyncio.CancelledError):
        return describe_close(exc, heartbeat_s)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# aio-pika logs each failed attempt (``Reconnects._pace``): this long without one while the
# connection is down, its reconnect loop is taken for stuck and the connection is replaced.
STALLED_AFTER_S = 15.0
# Called with a robust connection whose own reconnect loop stopped trying.
Replace = Callable[[AbstractRobustConnection], Coroutine[Any, Any, None]]


class Reconnects:
    def __init__(self, nodes: BrokerNodes, heartbeat_s: int, replace: Replace) -> None:
        self.nodes = nodes
        self.heartbeat_s = heartbeat_s
        self.replace = replace
        self.outage = OutageLog(logger, "the broker is unreachable", "connected to the broker")
        self._pacing: asyncio.Task[None] | None = None
        self._replacing: asyncio.Task[None] | None = None

    def connect_failed(self, url: str, error: BaseException) -> float:
        """A first connection failed: say so, move to the next node, and return how long to
        wait before the next attempt."""
        self.outage.failed(f"{node_name(url)}: {describe_connect_failure(error, url)}")
        self.nodes.failed()
        return reconnect_interval(self.outage.failures)

    def connected(self) -> None:
        if self.outage.ongoing:
            self.outage.worked(f", at {self.nodes.describe()}")
        else:
            logger.info("connected to the broker at %s", self.nodes.describe())

    def lost(self, connection: AbstractRobustConnection, reason: BaseException | None) -> None:
        """The connection closed under us: say it once, and pace aio-pika's attempts."""
        if connection.close_called or self._pacing is not None:
            return  # closed on purpose, or already being paced
        # The one line an outage writes when it begins: aio-pika's and aiormq's own records of
        # it (an ERROR and a traceback per attempt) are debug chatter (``shared.logs``).
        self.outage.failed(f"lost the connection: {_reason(reason, self.heartbeat_s)}")
        self._pacing = asyncio.create_task(self._pace(connection), name="broker-reconnect-pace")

    async def _pace(self, connection: AbstractRobustConnection) -> None:
        """Set aio-pika's interval before each of its attempts, and watch that it makes them:
        a robust connection whose consumer the broker cancelled just as the connection closed
        (a deleted vhost) was seen never to try again, its reconnect loop waiting on the dead
        connection; that one is replaced by a new connection (``BrokerLink``)."""
        loop = asyncio.get_running_loop()
        attempts = 0
        tried, tried_at = chatter_count("aio_pika.robust_connection"), loop.time()
        try:
            while not connection.connected.is_set() and not connection.close_called:
                if chatter_count("aio_pika.robust_connection") != tried:
                    tried, tried_at = chatter_count("aio_pika.robust_connection"), loop.time()
                elif loop.time() - tried_at > STALLED_AFTER_S:
                    logger.warning(
                        "no attempt to reconnect for %.0fs: replacing the broker connection", loop.time() - tried_at
                    )
                    self._replacing = asyncio.create_task(self.replace(connection), name="broker-replace")
                    return
                if attempts:
                    self.outage.failed(f"the last attempt: {self._last_attempt()}")
                attempts += 1
                interval = reconnect_interval(attempts)
                connection.reconnect_interval = interval  # type: ignore[attr-defined]
                if len(self.nodes.urls) > 1:
                    # aio-pika reconnects to ``connection.url``: each attempt goes to the next
                    # node of a cluster (the lost one most likely went away with its node). One
                    # node: the URL aio-pika was given stays untouched.
                    url = self.nodes.failed()
                    connection.url = URL(amqp_url_with_heartbeat(url, self.heartbeat_s))  # type: ignore[attr-defined]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(connection.connected.wait(), interval)
        finally:
            connection.reconnect_interval = RECONNECT_FIRST_S  # type: ignore[attr-defined]
            self._pacing = None

    def _last_attempt(self) -> str:
        """Why the last attempt to reconnect failed, as aio-pika logged it (shown at DEBUG)."""
        said = last_chatter("aio_pika.robust_connection")
        if said is None:
            return "no answer yet"
        return vhost_refused_text(self.nodes.current) if vhost_refused(said) else said

    def close(self) -> None:
        for task in (self._pacing, self._replacing):
            if task is not None:
                task.cancel()
