"""What the service tells the manager of itself, unasked or asked: its birth, heartbeats, the
digest and list of what a session runs (anti-entropy), and the start messages of observers
the manager has no row for. Each goes through the outbox; what holds only while one session
lives is tagged with it, and dropped if that session dies unpublished.

A heartbeat says what the start consumers do, not what was asked: the balancer sends its
placement again while the two differ, and moves nothing in their pools meanwhile, so a new
placement is confirmed by a heartbeat at once (``ObserverService._consume_under``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Callable

from observer_service import metrics
from observer_service.outbox import Outbox
from observer_service.refusals import Refusals
from observer_service.runner import Runner
from observer_service.session import Session
from observer_service.settings import ServiceSettings
from observer_service.watchdog import LoopWatchdog
from shared import __version__
from shared.messages import ObserversDescribed, ServiceBorn, ServiceDigest, ServiceHeartbeat, ServiceInventory
from shared.settings import hostname

logger = logging.getLogger(__name__)


class Reports:
    """``live`` is the session reports may speak for now: None while there is none, or once
    the service said goodbye (nothing may follow ServiceStopped)."""

    def __init__(
        self,
        service_id: uuid.UUID,
        outbox: Outbox,
        runner: Runner,
        refusals: Refusals,
        watchdog: LoopWatchdog,
        live: Callable[[], Session | None],
    ) -> None:
        self.service_id = service_id
        self.outbox = outbox
        self.runner = runner
        self.refusals = refusals
        self.watchdog = watchdog
        self.live = live

    def born(self, settings: ServiceSettings) -> None:
        born = ServiceBorn(
            service_id=self.service_id,
            name=settings.service_name,
            workers_count=settings.workers_count,
            process_slots=settings.process_slots,
            pools=settings.pools,
            kinds=sorted(self.runner.kinds),
            kind_infos=[k.kind.announced_info() for k in self.runner.kinds.values()],
            host=hostname(),
            pid=os.getpid(),
            version=__version__,
        )
        self.outbox.put(born)

    def inventory(self) -> None:
        """The whole list of what the session runs: once per session, at its start, and when
        the manager asks (its rows disagree with a digest)."""
        session = self.live()
        if session is None:
            return
        inventory = ServiceInventory(
            service_id=self.service_id, observer_ids=self.runner.inventory(session), session_id=session.id
        )
        self.outbox.put(inventory, session)  # what it lists holds only while this session lives

    def describe(self, observer_ids: list[uuid.UUID]) -> None:
        """The start messages of those we run, for the manager to adopt them (it lost their
        rows). What we do not run we leave out: there is nothing to adopt."""
        session = self.live()
        if session is None:
            return
        starts = [r.start() for oid in observer_ids if (r := self.runner.running.get(oid)) and r.session is session]
        logger.warning("the manager has no row for %d observer(s) running here: describing them", len(starts))
        self.outbox.put(ObserversDescribed(service_id=self.service_id, session_id=session.id, starts=starts), session)

    def heartbeat(self) -> None:
        """A heartbeat now, with the worst loop lag since the last periodic one."""
        self._heartbeat(self.watchdog.lag_ms)

    def _heartbeat(self, lag_ms: float) -> None:
        session = self.live()
        placement = None if session is None else session.placement
        if session is None or placement is None or session.closed.is_set():
            return
        heartbeat = ServiceHeartbeat(
            service_id=self.service_id,
            session_id=session.id,
            running=len(self.runner.running),
            loop_lag_ms=round(lag_ms, 3),
            refused=self.refusals.summary(),
            priority=placement.priority,
            cordoned=placement.cordoned,
            pool_priorities=dict(placement.pools),
            start_queues=placement.start_queues,
            queue_held=session.queue_held(),
        )
        self.outbox.put(heartbeat)

    async def heartbeat_loop(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            lag = self.watchdog.take_lag()
            metrics.LOOP_LAG.set(lag / 1000)
            self._heartbeat(lag)

    async def digest_loop(self, every_s: float) -> None:
        """Anti-entropy: every ``every_s`` a digest of what this session runs; the manager
        asks for the whole list only when its rows disagree (``InventoryRequest``)."""
        while True:
            await asyncio.sleep(every_s)
            session = self.live()
            if session is not None and not session.closed.is_set():
                count, digest_hex = self.runner.running.digest(session)
                digest = ServiceDigest(
                    service_id=self.service_id, session_id=session.id, count=count, digest=digest_hex
                )
                self.outbox.put(digest, session)
