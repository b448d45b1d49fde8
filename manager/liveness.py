"""Which services are lost: judged by evidence, not by lateness (issue 17).

A late heartbeat is only a reason to ask. On a busy machine a service's heartbeats wait
behind its reports, behind a broker that is paging or behind a flood of deliveries; three
late ones used to mark it lost, count a host death against each of its observers and
(earlier) fail them, while nothing had died and the broker still held its deliveries for it.

So a service whose heartbeats are ``lost_after_heartbeats`` periods late is judged by the
broker, which is the authority on what it owns: its connection lives (its exclusive control
queue is locked) → it is late, not lost, and stays alive (one warning); the connection is
gone → the broker has requeued its deliveries, so it is lost, and its host death is
recorded (``probation.host_died``). No answer from the broker is no evidence: nothing is
judged until it answers. Judging waits, as before, until the state backlog is drained: a
``ServiceStopped`` still in the queue must not be taken for a death.

The host-death step is one transaction that takes observer rows first, in id order, then
the service row (the state consumer's order), and is run again when it loses a deadlock:
before, it marked the service lost in one transaction and recorded the death in a second;
when the second lost a deadlock the death was never recorded (the service was already lost).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db.models import Service, ServiceStatus
from manager.db.retry import retry_lost_races
from manager.metrics import SERVICES_LATE, SERVICES_LOST
from manager.state.probation import ProbationPolicy, host_died
from manager.state.rows import ObserverRows, ServiceRows
from shared.settings import ManagerSettings

logger = logging.getLogger(__name__)

Isolate = Callable[[dict[uuid.UUID, uuid.UUID]], Awaitable[None]]


class _SpokeMeanwhile(Exception):
    """A heartbeat landed while the death was being recorded: roll it back."""


class Liveness:
    def __init__(
        self,
        settings: ManagerSettings,
        sessions: async_sessionmaker[AsyncSession],
        broker: BrokerLink,
        probation: ProbationPolicy,
        isolate: Isolate,
    ) -> None:
        self.silence = timedelta(seconds=settings.silence_s)
        self.sessions = sessions
        self.broker = broker
        self.probation = probation
        self.isolate = isolate
        self._late: set[uuid.UUID] = set()  # late but connected, already said so

    async def judge(self) -> None:
        """One pass: ask the broker about every alive service whose heartbeats are late."""
        async with self.sessions() as session:
            late = (
                await session.execute(
                    select(Service.id, Service.name, Service.last_heartbeat_at).where(
                        Service.status == ServiceStatus.ALIVE,
                        Service.last_heartbeat_at < datetime.now(UTC) - self.silence,
                    )
                )
            ).all()
        if not late:
            self._late.clear()
            return
        connected = await self.broker.services_connected(service_id for service_id, _, _ in late)
        for service_id, name, last_heard in late:
            if connected[service_id]:
                if service_id not in self._late:
                    SERVICES_LATE.inc()
                    logger.warning(
                        "service %s has not been heard of for %.0fs, but the broker says its connection lives "
                        "(busy or overloaded, or its reports wait in the state queue): not lost",
                        name,
                        (datetime.now(UTC) - last_heard).total_seconds(),
                    )
                continue
            if await self.declare_lost(service_id, last_heard):
                SERVICES_LOST.inc()
                logger.warning(
                    "service %s (%s) lost: silent since %s and its broker connection is gone",
                    name,
                    service_id,
                    last_heard,
                )
        self._late = {service_id for service_id, _, _ in late if connected[service_id]}

    async def declare_lost(self, service_id: uuid.UUID, last_heard: datetime) -> bool:
        """Record the death of a service silent since ``last_heard``; False if it spoke since."""

        async def transaction() -> dict[uuid.UUID, uuid.UUID]:
            now = datetime.now(UTC)
            async with self.sessions.begin() as session:
                rows = ObserverRows(session)
                isolate = await host_died(rows, service_id, last_heard, now, self.probation)
                await rows.flush()
                # Last: the consumer locks observers, then their services.
                if not await ServiceRows(session).mark_lost(service_id, last_heard, now):
                    raise _SpokeMeanwhile
            return isolate

        try:
            isolate = await retry_lost_races(transaction, f"the host death of {service_id}")
        except _SpokeMeanwhile:
            return False
        await self.isolate(isolate)
        return True
