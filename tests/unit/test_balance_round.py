"""``manager.balance.rounds``: what one round of the balancer asks services to hand over."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.balance import fleet as fleet_rows
from manager.balance.handovers import Handovers
from manager.balance.plan import Member, Move
from manager.balance.rounds import SETTLE_ROUNDS, BalanceRound
from manager.broker import BrokerLink
from manager.settings import ManagerSettings
from shared.messages import EVEN, SetPlacement, StopObservers


class _Sessions:
    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[None]:
        yield None


class _Probes:
    async def start_queues_in_use(self, pool: str, at_least: int) -> int:
        return at_least


class _Broker:
    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.probes = _Probes()
        self.start_queues_in_use = 1

    async def declare_start_queues(self, pool: str) -> None:
        pass

    async def publish_control(self, message: Any) -> None:
        self.sent.append(message)


def _member(name: str, running: int, capacity: int = 100, **kw: Any) -> Member:
    service_id = uuid.uuid5(uuid.NAMESPACE_DNS, name)
    return Member(service_id, name, capacity, running, ("default",), kinds=frozenset({"probe"}), **kw)


class _Round:
    """A balancer over ``fleet`` (replace its items to change what the next round sees), its
    rows and broker faked; ``placements`` is what the services' heartbeats report."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fleet: list[Member]) -> None:
        self.fleet = fleet
        self.placements: dict[uuid.UUID, Any] = {}
        self.sent_placements: dict[uuid.UUID, SetPlacement] = {}

        async def members(
            session: object, busy_now: set[uuid.UUID]
        ) -> tuple[list[Member], dict[uuid.UUID, str | None]]:
            return [dataclasses.replace(m, busy=m.id in busy_now) for m in self.fleet], {}

        async def movable(session: object, move: Move) -> list[tuple[uuid.UUID, uuid.UUID | None]]:
            return [(uuid.uuid4(), None) for _ in range(move.count)]

        async def set_drain_notes(session: object, notes: object) -> None:
            return None

        self.awaiting: set[str] = set()

        async def awaiting_broker(session: object, since: object) -> set[str]:
            return set(self.awaiting)

        self.in_flight: dict[str, int] = {}

        async def in_flight(session: object, since: object) -> dict[str, int]:
            return dict(self.in_flight)

        monkeypatch.setattr(fleet_rows, "awaiting_broker", awaiting_broker)
        monkeypatch.setattr(fleet_rows, "in_flight", in_flight)
        monkeypatch.setattr(fleet_rows, "members", members)
        monkeypatch.setattr(fleet_rows, "movable", movable)
        monkeypatch.setattr(fleet_rows, "set_drain_notes", set_drain_notes)
        self.broker = _Broker()
        settings = ManagerSettings(balance_moves_per_s=250, repair_interval_s=0.5)
        sessions = cast(async_sessionmaker[AsyncSession], _Sessions())
        self.balancer = BalanceRound(settings, sessions, cast(BrokerLink, self.broker), Handovers(), self.placements)

    async def run(self) -> dict[str, int]:
        """One round; how many observers it asked each service to hand over."""
        await self.balancer.run()
        names = {m.id: m.name for m in self.fleet}
        stops = [m for m in self.broker.sent if isinstance(m, StopObservers)]
        self.sent_placements |= {m.service_id: m for m in self.broker.sent if isinstance(m, SetPlacement)}
        out: dict[str, int] = {}
        for stop in stops:
            assert stop.service_id is not None and stop.hand_over
            out[names[stop.service_id]] = out.get(names[stop.service_id], 0) + len(stop.observer_ids)
        self.broker.sent.clear()
        return out

    def confirm(self) -> None:
        """Every service's heartbeat reports the placement last sent to it."""
        for service_id, sent in self.sent_placements.items():
            placed = (sent.priority, sent.cordoned, tuple(sorted(sent.pools.items())))
            self.placements[service_id] = (placed, sent.start_queues)


async def test_a_drain_and_an_even_load_move_are_not_made_in_one_round(monkeypatch: pytest.MonkeyPatch) -> None:
    # As CI met it: the first round moved 50 of 100 from "leaving" to stay-1 before stay-2
    # joined; then "leaving" is drained. Its 50 go to stay-2 (the emptiest, priority 2): stay-1
    # handing 25 to stay-2 in the same round made it 25 / 75, and the next round moved 24 back,
    # after the drain said "drained" and across the SIGTERM of the drained service.
    rounds = _Round(monkeypatch, [_member("leaving", 50, draining=True), _member("stay-1", 50), _member("stay-2", 0)])
    assert await rounds.run() == {}  # the placements are new: the pool waits a round

    # When the round runs: the drain moves, nobody else
    assert await rounds.run() == {"leaving": 50}

    # And while those hand-overs are still landing (the rows say stay-2 got 20 so far), the
    # pool waits for them rather than evening what it sees
    rounds.fleet[:] = [_member("leaving", 0, draining=True), _member("stay-1", 50), _member("stay-2", 20)]
    assert await rounds.run() == {}


async def test_a_drain_waits_until_the_takers_confirm_their_placements(monkeypatch: pytest.MonkeyPatch) -> None:
    # A drain's starts handed back while a taker was still consuming again under its new
    # priority went all to the other taker on that queue (66 against 34, then 15 moved back):
    # nothing moves while a heartbeat reports another placement than the one sent.
    rounds = _Round(monkeypatch, [_member("leaving", 50, draining=True), _member("stay-1", 0), _member("stay-2", 0)])
    rounds.placements.update({m.id: (("stale",), 1) for m in rounds.fleet})
    assert await rounds.run() == {}  # placements sent
    assert await rounds.run() == {}  # not confirmed yet
    rounds.confirm()
    assert await rounds.run() == {"leaving": 50}


async def test_a_service_that_never_confirms_holds_its_pool_only_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    rounds = _Round(monkeypatch, [_member("leaving", 50, draining=True), _member("stay-1", 0), _member("old", 0)])
    rounds.placements.update({m.id: (("stale",), 1) for m in rounds.fleet})
    asked = [await rounds.run() for _ in range(SETTLE_ROUNDS + 1)]
    assert asked == [{}] * SETTLE_ROUNDS + [{"leaving": 50}]


async def test_a_pool_whose_starts_the_broker_holds_for_a_dead_session_is_not_evened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As bench-cluster met it: a node's death fences its service, which comes back empty;
    # its starts return to it once the queue lets the old session go (2 s). A round in
    # between saw it at 0 and asked the others for 250 hand-overs of observers running fine.
    rounds = _Round(monkeypatch, [_member("a", 60), _member("b", 60), _member("emptied", 0)])
    rounds.awaiting = {"default"}
    assert await rounds.run() == {}  # the placements are new
    rounds.confirm()
    assert await rounds.run() == {}
    assert await rounds.run() == {}

    # Once no start waits in the broker, the pool is evened again.
    rounds.awaiting.clear()
    assert await rounds.run() == {"a": 20, "b": 20}


async def test_a_burst_of_creates_moves_nothing_while_the_rows_lag_behind_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # As a create of 100,000 met it: the broker dealt the burst evenly, but the reports
    # reached each service's rows at their own pace. Evened on that, the placement sent the
    # whole burst to the services that looked under, and after the fifth round the balancer
    # asked 250 observers to move each round, restarts of observers that ran fine.
    def lagging(a: int, b: int, c: int) -> list[Member]:
        return [_member("a", a, capacity=100_000), _member("b", b, capacity=100_000), _member("c", c, capacity=100_000)]

    rounds = _Round(monkeypatch, lagging(529, 325, 350))
    rounds.in_flight = {"default": 4_000}
    for a, b, c in [(529, 325, 350), (3326, 3175, 650), (5355, 3675, 3675), (7650, 5627, 5680)]:
        rounds.fleet[:] = lagging(a, b, c)
        assert await rounds.run() == {}
        rounds.confirm()
    # Every service stays at one priority: the burst goes round-robin, none gets it all
    assert {sent.priority for sent in rounds.sent_placements.values()} == {EVEN}

    # Once it has landed, the rows are what the services run, and a real difference moves
    rounds.in_flight = {}
    rounds.fleet[:] = lagging(40_000, 30_000, 30_000)
    assert await rounds.run() == {}  # the placements are new
    rounds.confirm()
    assert await rounds.run() == {"a": 125}  # toward 33,334, at the round's budget


async def test_a_drain_is_made_while_the_broker_holds_starts_for_a_dead_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rounds = _Round(monkeypatch, [_member("a", 60, draining=True), _member("b", 60), _member("emptied", 0)])
    rounds.awaiting = {"default"}
    assert await rounds.run() == {}  # the placements are new
    rounds.confirm()
    assert await rounds.run() == {"a": 60}  # an operator asked for it; b hands nothing over


async def test_only_the_pool_whose_starts_the_broker_holds_waits_in_a_fleet_of_different_sizes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Services of 100 and 300 workers in pool "default", and two of 100 in pool "other":
    # the broker holds starts of "default" only, so "other" is evened as before.
    def member(name: str, capacity: int, running: int, pool: str) -> Member:
        service_id = uuid.uuid5(uuid.NAMESPACE_DNS, name)
        return Member(service_id, name, capacity, running, (pool,), kinds=frozenset({"probe"}))

    rounds = _Round(
        monkeypatch,
        [
            member("small", 100, 90, "default"),
            member("big", 300, 0, "default"),  # came back empty from a dead node
            member("o-1", 100, 80, "other"),
            member("o-2", 100, 0, "other"),
        ],
    )
    rounds.awaiting = {"default"}
    assert await rounds.run() == {}  # the placements are new
    rounds.confirm()
    assert await rounds.run() == {"o-1": 40}
    rounds.awaiting.clear()
    rounds.fleet[2:] = [member("o-1", 100, 40, "other"), member("o-2", 100, 40, "other")]
    assert await rounds.run() == {"small": 67}  # to its share of 90 over 400 workers, rounded up
