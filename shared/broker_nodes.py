"""The broker's node URLs (a RabbitMQ cluster), and which one to try next.

aio-pika and aiormq connect to one URL and reconnect to that same URL; a client of a
cluster must move to another node when its node goes away. Each process keeps the list in
the order it was given (``ORCH_AMQP_URLS``) and moves to the next node only after a failure,
so a fleet does not pile onto the first node after a blip. It starts at its *home*: the
first URL, or for a service the one its name picks (``ORCH_AMQP_HOME=by-name``), so that a
fleet given one list (a Kubernetes Secret) spreads over the nodes; a service returns there
once the node is back (``observer_service/home_node.py``).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)


class BrokerNodes:
    def __init__(self, urls: Sequence[str], *, home_key: str | None = None) -> None:
        """``home_key``: the home is the URL this string's stable hash picks (CRC-32: the same
        in every process and release), else the first."""
        if not urls:
            raise ValueError("no broker URL")
        self.urls = list(urls)
        self.home = 0 if home_key is None else zlib.crc32(home_key.encode()) % len(self.urls)
        self._at = self.home

    @property
    def at_home(self) -> bool:
        return self._at == self.home

    @property
    def home_url(self) -> str:
        return self.urls[self.home]

    def go_home(self) -> None:
        """The next session opens at the home node."""
        self._at = self.home

    @property
    def current(self) -> str:
        """The URL to use now: the one that last worked, or the next after a failure."""
        return self.urls[self._at]

    def failed(self) -> str:
        """The current node failed: the next one (round the list), returned."""
        self._at = (self._at + 1) % len(self.urls)
        return self.current

    def describe(self) -> str:
        """The current node for a log line: host and port, never the credentials."""
        return node_name(self.current)


def warn_if_classic_on_cluster(urls: Sequence[str], queue_type: str) -> None:
    """Classic queues asked for on several nodes: each lives on one node, and when that
    node dies its starts and reports wait until it returns. Said once at start."""
    if len(urls) > 1 and queue_type == "classic":
        logger.warning(
            "ORCH_QUEUE_TYPE=classic with %d broker nodes: a classic queue lives on one node and nothing "
            "converges while that node is down; unset ORCH_QUEUE_TYPE (quorum on several nodes) unless "
            "these URLs lead to one node",
            len(urls),
        )


def node_name(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname or '?'}:{parts.port or (5671 if parts.scheme == 'amqps' else 5672)}"
