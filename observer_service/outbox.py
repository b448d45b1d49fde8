"""Ordered, in-memory queue of state reports waiting to be published.

Reports are published in the order they were made (the manager relies on per-service
order). A report leaves the outbox only after the broker confirmed it, so a broken session
loses nothing: the next session publishes the same reports again. The manager's rules are
idempotent, so a report published twice (confirm lost with the connection) is harmless.

One exception: a start report (or an inventory) not yet published when its session died is
dropped. Its delivery went back to the queue with the session and may already run
elsewhere; published late, it would tell the manager that this service took the observer
over from the service really running it, and the manager would stop the only running copy (docs/design.md,
invariant 3).

Starts wait for room (``has_room``/``room``): past ``high_water`` unpublished reports the
runner starts no more deliveries (they stay held, unstarted) until the publisher catches
up. Without it a burst of starts after a reconnect outruns the publisher, and the drops and
their log lines starve the loop (figures: docs/design.md, "Pauses and the lease").
``max_size`` stays as the bound for what cannot wait (stops, failures, heartbeats during a
long broker outage); what it drops is counted and logged at most every ``_DROP_LOG_S``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from dataclasses import dataclass

from shared.messages import (
    OBSERVER_REPORT_TYPES,
    Isolation,
    Message,
    ObserverFailed,
    ObserverIsolated,
    ObserverRetrying,
    ObserversDescribed,
    ObserversStarted,
    ObserverStopped,
    ReportBatch,
    ServiceDigest,
    ServiceInventory,
)
from shared.tracing import Carrier

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StartedReport:
    """An observer started, waiting in the outbox: ``pack`` sends runs of them as one
    ``ObserversStarted``. A plain record rather than a pydantic report: a
    failover queues one per moved observer (see ``ObserversStarted``)."""

    observer_id: uuid.UUID
    service_id: uuid.UUID
    session_id: uuid.UUID
    redelivered: bool
    isolation: Isolation
    trace: Carrier | None = None  # the context of its ``start observer`` span, while traced

    def key(self) -> tuple[uuid.UUID, uuid.UUID, bool, Isolation]:
        """Reports with the same key travel in one ``ObserversStarted``."""
        return self.service_id, self.session_id, self.redelivered, self.isolation


Report = Message | StartedReport


_DROP_LOG_S = 10.0


class Outbox:
    def __init__(self, max_size: int = 200_000, high_water: int = 20_000) -> None:
        # (report, the session it is about if it is only true while that session lives,
        #  a future resolved once the report left the outbox: True confirmed, False dropped)
        self._items: collections.deque[tuple[Report, object | None, asyncio.Future[bool] | None]] = collections.deque()
        self._max_size = max_size
        self._high_water = min(high_water, max_size)
        self._not_empty = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self._room = asyncio.Event()
        self._room.set()
        self._dropped: collections.Counter[str] = collections.Counter()  # since the last log line
        self._drop_logged = 0.0

    def put(self, message: Report, session: object | None = None) -> None:
        self._put(message, session, None)

    def put_confirmed(self, message: Message) -> asyncio.Future[bool]:
        """Queue a report; the future resolves True once the broker confirmed it (and so
        every report queued before it), False if it was dropped unpublished."""
        confirmed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._put(message, None, confirmed)
        return confirmed

    def _put(self, message: Report, session: object | None, confirmed: asyncio.Future[bool] | None) -> None:
        if len(self._items) >= self._max_size:
            dropped, _, dropped_confirm = self._items.popleft()
            _resolve(dropped_confirm, False)
            self._dropped[type(dropped).__name__] += 1
            self._log_drops()
        self._items.append((message, session, confirmed))
        self._not_empty.set()
        self._empty.clear()
        if len(self._items) >= self._high_water:
            self._room.clear()

    def _log_drops(self) -> None:
        now = time.monotonic()
        if now - self._drop_logged < _DROP_LOG_S:
            return
        self._drop_logged = now
        # The inventory repairs what a dropped report would have said.
        what = ", ".join(f"{count} {name}" for name, count in self._dropped.most_common())
        logger.warning("state outbox full (%d): dropped %s", self._max_size, what)
        self._dropped.clear()

    def has_room(self) -> bool:
        """Fewer than ``high_water`` reports wait: a start may be reported."""
        return len(self._items) < self._high_water

    async def room(self) -> None:
        """Until ``has_room``."""
        while not self.has_room():
            await self._room.wait()

    def _left(self) -> None:
        if not self._items:
            self._empty.set()
        if len(self._items) < self._high_water:
            self._room.set()

    def __len__(self) -> int:
        return len(self._items)

    async def peek_batch(self, limit: int) -> list[Report]:
        """Wait for at least one report; return up to ``limit`` from the head, in order."""
        while not self._items:
            self._not_empty.clear()
            await self._not_empty.wait()
        return [self._items[i][0] for i in range(min(limit, len(self._items)))]

    def drop_head(self, count: int) -> None:
        """The first ``count`` reports were confirmed by the broker."""
        for _ in range(min(count, len(self._items))):
            _resolve(self._items.popleft()[2], True)
        self._left()

    def discard_started(self, session: object) -> int:
        """Drop the unpublished starts and inventories of a session that died."""
        kept = collections.deque(
            item for item in self._items if not (item[1] is session and isinstance(item[0], _TRUE_WHILE_SESSION_LIVES))
        )
        dropped = len(self._items) - len(kept)
        self._items = kept
        self._left()
        return dropped

    async def wait_empty(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._empty.wait(), timeout)
        except TimeoutError:
            return False
        return True


# Reports that describe a session's deliveries: stale once it died.
_TRUE_WHILE_SESSION_LIVES = (StartedReport, ServiceInventory, ServiceDigest, ObserversDescribed)


def _resolve(confirmed: asyncio.Future[bool] | None, value: bool) -> None:
    if confirmed is not None and not confirmed.done():
        confirmed.set_result(value)


REPORTS_PER_BATCH = 500


def pack(messages: list[Report], per_batch: int = REPORTS_PER_BATCH) -> list[Message]:
    """The outbox's reports as messages, in order: a run of ``StartedReport`` with the same
    key becomes one ``ObserversStarted``, a run of other observer reports one
    ``ReportBatch`` (at most ``per_batch`` each); other messages pass as they are."""
    packed: list[Message] = []
    run: list[ObserverStopped | ObserverRetrying | ObserverFailed | ObserverIsolated] = []
    started: list[StartedReport] = []

    def flush() -> None:
        if started:
            first = started[0]
            packed.append(
                ObserversStarted(
                    service_id=first.service_id,
                    session_id=first.session_id,
                    redelivered=first.redelivered,
                    isolation=first.isolation,
                    observer_ids=[r.observer_id for r in started],
                )
            )
            started.clear()
        if len(run) == 1:
            packed.append(run[0])
        elif run:
            packed.append(ReportBatch(service_id=run[0].service_id, reports=list(run)))
        run.clear()

    for message in messages:
        if isinstance(message, StartedReport):
            if run or (started and (len(started) >= per_batch or started[0].key() != message.key())):
                flush()
            started.append(message)
        elif isinstance(message, OBSERVER_REPORT_TYPES):
            if started or (run and (len(run) >= per_batch or run[0].service_id != message.service_id)):
                flush()
            run.append(message)
        else:
            flush()
            packed.append(message)
    flush()
    return packed
