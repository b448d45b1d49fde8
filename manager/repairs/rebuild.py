"""The broker rebuilt from the database (issue 11): PostgreSQL is the truth.

A broker that lost its data (a fresh node, ``rabbitmqctl reset``, its vhost deleted and made
again) has lost every start message, held or waiting, so nothing would ever run again.

* **Detection.** The manager's state side declares a durable, empty marker queue
  (``topology.REBUILD_MARKER``) once the broker holds every start. After each connection
  and reconnection it checks, on a connection of its own, that the marker is still there;
  missing means the broker is not the one the starts were published to. Nobody else
  declares the marker (services declare the start queues themselves, so a start queue that
  exists proves nothing).
* **Rebuild.** (1) Every observer on a service is released: Processing → Created, and
  OnDeleting keeps its status; no service. The broker closed every connection when it lost its
  data, so every service fenced its observers; a service that still ran one would list it in
  its next inventory and take it back, and its duplicate is then stopped by the rules.
  (2) A start is published for every Created and OnDeleting observer (an OnDeleting one is
  stopped by the service that takes it: the rules answer its start report with a stop).
  (3) The marker is declared. A crash before (3) rebuilds again on the next start: the
  duplicate starts that makes are absorbed by the rules.
* A first start on an empty broker finds no marker either: with an empty database there is
  nothing to publish; with rows (a move to a new broker) they are published, as they should.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.db import observers
from manager.repairs.base import Repair
from manager.start_messages import start_message
from manager.start_publisher import StartPublisher

logger = logging.getLogger(__name__)

_BATCH = 5_000
_DETAIL = "the broker lost its data: released, its start published again"


_RELEASE_WAIT_S = 30.0  # for rows others hold; past it the next pass rebuilds again
_RELEASE_POLL_S = 0.05


async def rebuild(sessions: async_sessionmaker[AsyncSession], starts: StartPublisher) -> int:
    """Release every observer from its service and publish a start for every live one; returns how
    many starts were published. The caller declares the marker afterwards."""
    began = time.monotonic()
    count = await _release_all(sessions)
    published = 0
    after: uuid.UUID | None = None
    while True:
        async with sessions() as session:
            rows = await observers.needing_a_start(session, after, _BATCH)
        if not rows:
            break
        # Confirmed, then not pending: nothing left for the pending-start repair.
        await starts.publish_pending([start_message(obs) for obs in rows], rebuilding=True)
        published += len(rows)
        after = rows[-1].id
    if count or published:
        logger.warning(
            "the broker lost its data (no rebuild marker): released %d observer(s) from their services, "
            "published %d start(s) again from the database in %.1fs",
            count,
            published,
            time.monotonic() - began,
        )
    else:  # a first start, or a broker that lost nothing of ours
        logger.info("no rebuild marker on the broker and no live observer: nothing to publish")
    return published


async def _release_all(sessions: async_sessionmaker[AsyncSession]) -> int:
    """Release every observer from its service (Processing → Created, OnDeleting keeps its
    status; no service), never waiting for a row another writer holds: such a row is taken in a later
    round, once that writer committed. Raises ``TimeoutError`` if some stay held
    past ``_RELEASE_WAIT_S``."""
    now = datetime.now(UTC)
    released = 0
    deadline = time.monotonic() + _RELEASE_WAIT_S
    while True:
        async with sessions.begin() as session:
            done = await observers.release_unlocked(session, now, _DETAIL)
        released += done
        if done:
            continue
        async with sessions() as session:
            if not await observers.any_on_a_service(session):
                return released
        if time.monotonic() > deadline:
            raise TimeoutError(f"observers on services stayed locked by other writers for {_RELEASE_WAIT_S:g}s")
        await asyncio.sleep(_RELEASE_POLL_S)


class BrokerRebuild(Repair):
    """After each (re)connection: a broker without the marker lost its data; publish every
    start again from the database (``rebuild``), then declare the marker."""

    name = "rebuild_broker"

    def __init__(self, sessions: async_sessionmaker[AsyncSession], starts: StartPublisher) -> None:
        self.sessions = sessions
        self.starts = starts
        self.broker = starts.broker
        self._marker_checked = 0  # broker.connects when the marker was last checked

    async def run(self) -> None:
        connects = self.broker.connects
        if connects == self._marker_checked:
            return
        if not await self.broker.probes.marker_present():
            await rebuild(self.sessions, self.starts)
            await self.broker.probes.declare_marker()
        self._marker_checked = connects
