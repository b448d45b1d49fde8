"""Which services are lost: judged by evidence, not by lateness (issue 17).

A late heartbeat is only a reason to ask. On a busy machine a service's heartbeats wait
behind its reports, behind a broker that is paging or behind a flood of deliveries; judged
by lateness alone, it would be called lost and charged a service's death against each of its
observers while nothing had died and the broker still held its deliveries for it.

So a service whose heartbeats are ``lost_after_heartbeats`` periods late is judged by the
broker, which is the authority on what it owns: its connection lives (its exclusive control
queue is locked) → it is late, not lost, and stays alive (one warning); the connection is
gone → the broker has requeued its deliveries, so it is lost, and its death is
recorded (``probation.service_died``). No answer from the broker is no evidence: nothing is
judged until it answers. Judging waits until the state backlog is drained: a
``ServiceStopped`` still in the queue must not be taken for a death.

A death is not recorded while the dead service's share is still moving: recording it writes a
``host_lost`` event for each of its observers, and in the middle of the takeover that takes
CPU the takeover needs (figures: docs/cost-curve.md). The broker has already given the share
away, so nothing waits for the record. It waits while the state rules applied a takeover
from that service within the last judging period (``StateContext.moved_from_at``), for at most
``MOVING_GRACE`` silences, and the log says so once.

The step that records a service's death is one transaction that takes observer rows first, in id order, then
the service row (the state consumer's order), and is run again when it loses a deadlock: in
two transactions, a second one that lost a deadlock would leave a lost service whose death
was never recorded.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db import services
from manager.db.retry import retry_lost_races
from manager.metrics import SERVICES_LATE, SERVICES_LOST
from manager.repairs.base import Repair
from manager.settings import ManagerSettings
from manager.state.context import StateContext
from manager.state.probation import ProbationPolicy, service_died
from manager.state.rows import ObserverRows, ServiceRows
from shared.messages import IsolateObservers

logger = logging.getLogger(__name__)

Isolate = Callable[[dict[uuid.UUID, uuid.UUID]], Awaitable[None]]
# How many silences a death may wait for the dead service's share to finish moving.
MOVING_GRACE = 20


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
        moved_from_at: dict[uuid.UUID, float],
    ) -> None:
        self.silence = timedelta(seconds=settings.silence_s)
        self.period_s = settings.silence_s / 4  # how often the background loop judges
        self.moving_grace = self.silence * MOVING_GRACE
        self.moved_from_at = moved_from_at  # written by the state rules
        self.sessions = sessions
        self.broker = broker
        self.probation = probation
        self.isolate = isolate
        self._late: set[uuid.UUID] = set()  # late but connected, already said so
        self._moving: set[uuid.UUID] = set()  # disconnected, share still moving, already said so

    async def judge(self) -> None:
        """One pass: ask the broker about every alive service whose heartbeats are late."""
        async with self.sessions() as session:
            late = await services.silent_since(session, datetime.now(UTC) - self.silence)
        self._forget_old_moves()
        if not late:
            self._late.clear()
            self._moving.clear()
            return
        sessions = {service_id: session_id for service_id, _, _, session_id in late}
        connected = await self.broker.probes.services_connected(list(sessions), sessions)
        moving: set[uuid.UUID] = set()
        for service_id, name, last_heard, _ in late:
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
            if self._share_moving(service_id, last_heard):
                moving.add(service_id)
                if service_id not in self._moving:
                    logger.warning(
                        "service %s has not been heard of for %.0fs and its broker connection is gone; other "
                        "services are still taking its observers over: its death is recorded once they are done",
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
        self._late = {service_id for service_id, _, _, _ in late if connected[service_id]}
        self._moving = moving

    def _share_moving(self, service_id: uuid.UUID, last_heard: datetime) -> bool:
        """A takeover from this service was applied within the last judging period, and it fell
        silent less than ``moving_grace`` ago."""
        moved_at = self.moved_from_at.get(service_id)
        return (
            moved_at is not None
            and time.monotonic() - moved_at < self.period_s
            and datetime.now(UTC) - last_heard < self.moving_grace
        )

    def _forget_old_moves(self) -> None:
        """Services whose observers moved away long ago (a live service's duplicates, a death
        recorded by a restart under its name) are of no more use here."""
        cutoff = time.monotonic() - self.moving_grace.total_seconds()
        for service_id in [s for s, at in self.moved_from_at.items() if at < cutoff]:
            del self.moved_from_at[service_id]

    async def declare_lost(self, service_id: uuid.UUID, last_heard: datetime) -> bool:
        """Record the death of a service silent since ``last_heard``; False if it spoke since."""

        async def transaction() -> dict[uuid.UUID, uuid.UUID]:
            now = datetime.now(UTC)
            async with self.sessions.begin() as session:
                rows = ObserverRows(session)
                isolate = await service_died(rows, service_id, last_heard, now, self.probation)
                await rows.flush()
                # Last: the consumer locks observers, then their services.
                if not await ServiceRows(session).mark_lost(service_id, last_heard, now):
                    raise _SpokeMeanwhile
            return isolate

        try:
            isolate = await retry_lost_races(transaction, f"the death of service {service_id}")
        except _SpokeMeanwhile:
            return False
        self.moved_from_at.pop(service_id, None)
        await self.isolate(isolate)
        return True


class JudgeHeartbeats(Repair):
    """``Liveness.judge`` every quarter of the silence, only while the manager is caught up:
    a heartbeat waiting in the state queue (after a manager restart, or behind a burst of
    reports) is no silence, and a ``ServiceStopped`` waiting there is no death."""

    name = "judge_heartbeats"

    def __init__(
        self,
        settings: ManagerSettings,
        sessions: async_sessionmaker[AsyncSession],
        broker: BrokerLink,
        context: StateContext,
        consumer_idle: Callable[[], bool],
    ) -> None:
        self.broker = broker
        self.consumer_idle = consumer_idle
        self.backlog_drained = False
        self.liveness = Liveness(settings, sessions, broker, context.probation, self._isolate, context.moved_from_at)
        self.period_s = self.liveness.period_s

    async def run(self) -> None:
        backlog = await self.broker.state_backlog()
        if backlog is None or backlog > 0 or not self.consumer_idle():
            if not self.backlog_drained:
                logger.info("state backlog: %s message(s) to apply before judging heartbeats", backlog)
            return
        if not self.backlog_drained:
            self.backlog_drained = True
            logger.info("state backlog drained: judging heartbeats from now on")
        await self.liveness.judge()

    async def _isolate(self, isolate: dict[uuid.UUID, uuid.UUID]) -> None:
        """Ask each service to move the observers on it that a death put on probation into child
        processes."""
        per_service: dict[uuid.UUID, list[uuid.UUID]] = {}
        for observer_id, service_id in isolate.items():
            per_service.setdefault(service_id, []).append(observer_id)
        for service_id, ids in per_service.items():
            logger.warning("%d observer(s) on probation: asking service %s to isolate them", len(ids), service_id)
            await self.broker.publish_control(IsolateObservers(observer_ids=ids, service_id=service_id))
