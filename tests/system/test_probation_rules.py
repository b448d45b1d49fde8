"""Which service deaths count against an observer (the state rules and the death step
in-process, on a real PostgreSQL): a move belongs to the broker session it left.

The order of reports these tests apply is one the state queue gives in a flapping network:
the old service, back under the same id, heartbeats from its new session before the new service's
report of the move (caused by the old session's end) is applied. Judged by time alone, that
move was "since the service was last heard of" and counted against its next death as well."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import cast

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db.models import Observer, Service
from manager.repairs.liveness import Liveness
from manager.settings import ManagerSettings
from manager.state.probation import ProbationPolicy
from manager.state.rules import StateRules
from shared.messages import ObserversStarted, ServiceBorn, ServiceHeartbeat, StateMessage

# Every observer here sees every death: the budget would let only one of ten through.
_POLICY = ProbationPolicy(after_service_deaths=2, window_s=600.0, budget=1.0)


class _Fleet:
    """Two services, ``a`` and ``b``, and ten observers started on ``a`` in session ``a1``."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions
        self.rules = StateRules(_POLICY)
        self.a, self.b = uuid.uuid4(), uuid.uuid4()
        self.a1, self.a2, self.b1 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        self.observers = [uuid.uuid4() for _ in range(10)]

    async def start(self) -> None:
        async with self.sessions.begin() as session:
            for i, oid in enumerate(self.observers):
                await session.execute(
                    text("INSERT INTO observers (id, name, kind, status) VALUES (:oid, :name, 'ticker', 'Created')"),
                    {"oid": oid, "name": f"o{i}"},
                )
        await self.apply(self.born(self.a, "a"), self.born(self.b, "b"))
        await self.apply(ObserversStarted(service_id=self.a, session_id=self.a1, observer_ids=self.observers))
        await self.apply(self.heartbeat(self.a, self.a1), self.heartbeat(self.b, self.b1))

    async def apply(self, *batch: StateMessage) -> None:
        async with self.sessions.begin() as session:
            await self.rules.preload(session, list(batch))
            for message in batch:
                await self.rules.apply(session, message, datetime.now(UTC))
            await self.rules.flush(session)

    async def die(self, service_id: uuid.UUID) -> None:
        """Judged lost, as the background loop judges a silent service whose connection is gone."""

        async def no_isolation(isolate: dict[uuid.UUID, uuid.UUID]) -> None:
            return None

        # The death step asks nothing of the broker: judging who is silent does.
        liveness = Liveness(ManagerSettings(), self.sessions, cast(BrokerLink, None), _POLICY, no_isolation, {})
        async with self.sessions() as session:
            last_heard = await session.scalar(select(Service.last_heartbeat_at).where(Service.id == service_id))
        assert last_heard is not None
        assert await liveness.declare_lost(service_id, last_heard)

    async def moved_to_b(self) -> None:
        """``b`` reports taking them over: the broker redelivered ``a``'s starts to it."""
        await self.apply(
            ObserversStarted(service_id=self.b, session_id=self.b1, redelivered=True, observer_ids=self.observers)
        )

    async def on_probation(self) -> list[uuid.UUID]:
        async with self.sessions() as session:
            return list(await session.scalars(select(Observer.id).where(Observer.probation_since.is_not(None))))

    @staticmethod
    def born(service_id: uuid.UUID, name: str) -> ServiceBorn:
        return ServiceBorn(
            service_id=service_id,
            name=name,
            workers_count=20,
            pools=["default"],
            kinds=["ticker"],
            host="h",
            pid=1,
            version="t",
        )

    @staticmethod
    def heartbeat(service_id: uuid.UUID, session_id: uuid.UUID) -> ServiceHeartbeat:
        return ServiceHeartbeat(service_id=service_id, session_id=session_id, running=10)


async def test_a_move_reported_after_its_service_came_back_is_not_counted_against_its_next_death(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    fleet = _Fleet(sessions)
    await fleet.start()
    # Given a flap: ``a`` is lost, and back under the same id in a new session before the
    # move of its observers to ``b`` (caused by that cut) is applied
    await fleet.die(fleet.a)
    await fleet.apply(fleet.heartbeat(fleet.a, fleet.a2))
    await fleet.moved_to_b()
    # When a second flap takes both services
    await fleet.die(fleet.a)
    await fleet.die(fleet.b)
    # Then each observer lost one service in it (``b``), and came back from the first: at two
    # deaths nobody is on probation. Counted by time, ``a``'s second death took them too.
    assert await fleet.on_probation() == []


async def test_a_move_from_the_session_that_died_still_counts(sessions: async_sessionmaker[AsyncSession]) -> None:
    fleet = _Fleet(sessions)
    await fleet.start()
    # Given ``a`` died in the session it was last heard from, its observers moved to ``b``
    # before the death was judged, and ``a`` never came back
    await fleet.moved_to_b()
    await fleet.die(fleet.a)
    # When ``b`` dies too
    await fleet.die(fleet.b)
    # Then each of them lost two services: on probation
    assert sorted(await fleet.on_probation()) == sorted(fleet.observers)


class _Incident:
    """Services born, observers started on them, services judged lost: the rules and the death
    step on a real database, with a policy of the test's choosing."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], policy: ProbationPolicy) -> None:
        self.sessions = sessions
        self.policy = policy
        self.rules = StateRules(policy)
        self.fleet = _Fleet(sessions)  # for its apply()
        self.fleet.rules = self.rules
        self.sessions_of: dict[uuid.UUID, uuid.UUID] = {}

    async def born(self) -> uuid.UUID:
        service, session = uuid.uuid4(), uuid.uuid4()
        self.sessions_of[service] = session
        await self.fleet.apply(_Fleet.born(service, f"h-{service.hex[:6]}"))
        await self.fleet.apply(_Fleet.heartbeat(service, session))
        return service

    async def observers(self, count: int, prefix: str) -> list[uuid.UUID]:
        ids = [uuid.uuid4() for _ in range(count)]
        async with self.sessions.begin() as session:
            for i, oid in enumerate(ids):
                await session.execute(
                    text("INSERT INTO observers (id, name, kind, status) VALUES (:oid, :name, 'ticker', 'Created')"),
                    {"oid": oid, "name": f"{prefix}{i}"},
                )
        return ids

    async def start_on(self, service: uuid.UUID, ids: list[uuid.UUID]) -> None:
        started = ObserversStarted(
            service_id=service, session_id=self.sessions_of[service], redelivered=True, observer_ids=ids
        )
        await self.fleet.apply(started)

    async def die(self, service: uuid.UUID) -> None:
        self.fleet.rules = self.rules
        liveness = Liveness(ManagerSettings(), self.sessions, cast(BrokerLink, None), self.policy, _no_isolation, {})
        async with self.sessions() as session:
            last_heard = await session.scalar(select(Service.last_heartbeat_at).where(Service.id == service))
        assert last_heard is not None
        assert await liveness.declare_lost(service, last_heard)

    async def on_probation(self) -> set[uuid.UUID]:
        return set(await self.fleet.on_probation())


async def _no_isolation(isolate: dict[uuid.UUID, uuid.UUID]) -> None:
    return None


async def test_in_an_incident_only_the_observer_present_at_most_deaths_goes_on_probation(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    # Given an incident: four times a service with eight healthy observers dies, and another
    # service with none: they see 4 of 8 deaths. By count alone (3 deaths) all eight would be
    # on probation; they saw half of what they could have seen
    incident = _Incident(sessions, ProbationPolicy(after_service_deaths=3, window_s=600.0, budget=1.0))
    bystanders = await incident.observers(8, "b")
    home = await incident.born()
    await incident.start_on(home, bystanders)
    for _ in range(4):
        await incident.die(await incident.born())  # an empty service
        await incident.die(home)
        home = await incident.born()
        await incident.start_on(home, bystanders)
    assert await incident.on_probation() == set()

    # When an observer created since then kills every service it lands on, three in a row
    poison = (await incident.observers(1, "p"))[0]
    for _ in range(3):
        service = await incident.born()
        await incident.start_on(service, [poison])
        await incident.die(service)

    # Then it alone goes on probation: it saw 3 of the 3 deaths it could have seen
    assert await incident.on_probation() == {poison}


async def test_the_budget_bounds_probation_whatever_the_evidence(sessions: async_sessionmaker[AsyncSession]) -> None:
    # Given four observers that saw every one of three deaths together (nothing sets one
    # apart) and a budget of 5 % of the live observers, at least one
    incident = _Incident(sessions, ProbationPolicy(after_service_deaths=3, window_s=600.0))
    together = await incident.observers(4, "t")
    for _ in range(3):
        service = await incident.born()
        await incident.start_on(service, together)
        await incident.die(service)
    # Then one is on probation; the others wait for more evidence
    assert len(await incident.on_probation()) == 1
