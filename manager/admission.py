"""Backpressure of the write API (issue 17): how many observers the API is creating or
stopping at once, all requests together.

Past ``ORCH_API_IN_FLIGHT`` a request is refused at once with 503 and ``Retry-After``,
before it touches the database or the broker: queued requests would only hold database
connections and publish into a broker that is already behind, and clients time out and
retry into the queue. A request alone may be larger than the bound (nothing else is in
flight, so it cannot crowd anyone out). One counter per API process: each process bounds
what it adds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from manager.errors import Unavailable
from manager.metrics import API_REFUSED_BUSY


class Admission:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    @contextlib.contextmanager
    def admit(self, count: int, doing: str) -> Iterator[None]:
        """Hold ``count`` places while the body runs, or raise ``Unavailable``."""
        if self.in_flight and self.in_flight + count > self.limit:
            API_REFUSED_BUSY.inc()
            raise Unavailable(
                f"the manager is {doing} {self.in_flight} observer(s) already (ORCH_API_IN_FLIGHT={self.limit}); "
                f"nothing was done with these {count}: retry in a few seconds"
            )
        self.in_flight += count
        try:
            yield
        finally:
            self.in_flight -= count
