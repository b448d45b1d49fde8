"""Emptying the start queues past ``ORCH_START_QUEUES``: what the balancer asks of each service
(``manager.balance.retire``), and the messages that carry it, which a peer older than them
still reads while nothing is to be retired."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace
from typing import Any, cast

import pytest

from manager.balance.plan import Member
from manager.balance.retire import QueueHeld, Retirement
from manager.broker import BrokerLink
from shared.messages import RetireStarts, ServiceHeartbeat, StartsGone, decode_control, decode_state

SESSION = uuid.uuid4()


def _member(name: str) -> Member:
    return Member(uuid.uuid5(uuid.NAMESPACE_DNS, name), name, 100, 0, ("default",))


async def _round(retirement: Retirement, fleet: list[Member], keep: int, budget: int, sent: _Sent) -> int:
    look = await retirement.look(fleet, {"p"}, keep, in_use=3)
    return await retirement.round(fleet, look, budget, sent)


async def _told(retirement: Retirement, fleet: list[Member], keep: int, in_use: int) -> int:
    return retirement.told(await retirement.look(fleet, {"p"}, keep, in_use))


async def _delete(retirement: Retirement, fleet: list[Member], keep: int, in_use: int, now: float) -> bool:
    return await retirement.delete_emptied(await retirement.look(fleet, {"p"}, keep, in_use), now)


class _Sent:
    def __init__(self) -> None:
        self.asks: list[RetireStarts] = []

    async def __call__(self, ask: RetireStarts, name: str) -> bool:
        self.asks.append(ask)
        return True


async def test_services_holding_starts_past_the_setting_are_asked_within_the_budget_once_per_heartbeat() -> None:
    a, b, c = _member("a"), _member("b"), _member("c")
    held = {
        a.id: QueueHeld(SESSION, (10, 5, 3), heard_at=1.0),
        b.id: QueueHeld(SESSION, (4, 0, 2), heard_at=1.0),
        c.id: QueueHeld(SESSION, (7,), heard_at=1.0),  # all in the first queue
    }
    retirement, sent = Retirement(held, {}), _Sent()

    assert await _round(retirement, [a, b, c], 1, 9, sent) == 9
    assert [(s.service_id, s.count, s.keep, s.session_id) for s in sent.asks] == [
        (a.id, 8, 1, SESSION),
        (b.id, 1, 1, SESSION),
    ]

    # Until a service's next heartbeat it is moving what it was asked for: not asked again.
    sent.asks.clear()
    assert await _round(retirement, [a, b, c], 1, 9, sent) == 0
    held[b.id] = QueueHeld(SESSION, (5, 0, 1), heard_at=2.0)
    assert await _round(retirement, [a, b, c], 1, 9, sent) == 1
    assert [(s.service_id, s.count) for s in sent.asks] == [(b.id, 1)]


async def test_nothing_is_asked_without_budget_or_past_the_queues_kept_and_the_dead_are_forgotten() -> None:
    a, b = _member("a"), _member("b")
    held = {a.id: QueueHeld(SESSION, (1, 2, 3), heard_at=1.0), b.id: QueueHeld(None, (0, 4), heard_at=1.0)}
    retirement, sent = Retirement(held, {}), _Sent()
    assert await _round(retirement, [a, b], 1, 0, sent) == 0
    assert await _round(retirement, [a, b], 3, 10, sent) == 0
    assert await _round(retirement, [a], 1, 10, sent) == 5  # b is gone: forgotten
    assert list(held) == [a.id]
    assert [s.count for s in sent.asks] == [5]


class _Probes:
    """A broker with ``use`` (ready, consumers) for each start queue of pool ``p``."""

    def __init__(self, use: dict[int, tuple[int, int]], refuse: bool = False) -> None:
        self.use = use
        self.refuse = refuse
        self.deleted: list[int] = []
        self.asked: list[int] = []

    async def start_queue_use(self, pool: str, index: int) -> tuple[int, int] | None:
        self.asked.append(index)
        return self.use.get(index)

    async def delete_start_queue(self, pool: str, index: int) -> bool:
        if self.refuse:
            return False
        del self.use[index]
        self.deleted.append(index)
        return True


def _broker(probes: _Probes) -> BrokerLink:
    broker = SimpleNamespace(probes=probes)
    return cast(BrokerLink, broker)


async def test_the_queues_past_the_setting_stay_consumed_while_a_start_is_held_from_them_or_waits_in_them() -> None:
    a = _member("a")
    held = {a.id: QueueHeld(SESSION, (5, 1), heard_at=1.0)}
    placements: dict[uuid.UUID, Any] = {}
    probes = _Probes({0: (0, 1), 1: (0, 1), 2: (0, 1)})
    retirement = Retirement(held, placements, _broker(probes))
    held[a.id] = QueueHeld(SESSION, (6, 0), heard_at=1.0)
    assert await _told(retirement, [a], 1, 3) == 3  # not heard from since this manager started
    placements[a.id] = ((1, False, ()), 3)
    held[a.id] = QueueHeld(SESSION, (5, 1), heard_at=1.0)
    assert await _told(retirement, [a], 1, 3) == 3  # held
    held[a.id] = QueueHeld(SESSION, (6, 0), heard_at=2.0)
    probes.use[2] = (1, 1)
    assert await _told(retirement, [a], 1, 3) == 3  # one waits in queue 2
    probes.use[2] = (0, 1)
    assert await _told(retirement, [a], 1, 3) == 1
    assert await _told(retirement, [a], 1, 1) == 1


async def test_emptied_queues_are_deleted_last_first_only_once_every_service_consumes_only_the_ones_kept() -> None:
    a, b = _member("a"), _member("b")
    held = {a.id: QueueHeld(SESSION, (5, 0, 0), heard_at=1.0)}
    placements: dict[uuid.UUID, Any] = {a.id: ((1, False, ()), 1), b.id: ((1, False, ()), 3)}
    probes = _Probes({0: (0, 2), 1: (0, 0), 2: (0, 0)})
    retirement = Retirement(held, placements, _broker(probes))
    assert not await _delete(retirement, [a, b], 1, 3, 0.0)  # b consumes three
    placements[b.id] = ((1, False, ()), 1)
    probes.use[1] = (0, 1)  # a consumer left on queue 1
    assert not await _delete(retirement, [a, b], 1, 3, 0.0)
    assert probes.deleted == []
    probes.use[1] = (0, 0)
    assert await _delete(retirement, [a, b], 1, 3, 0.0)
    assert probes.deleted == [2, 1] and list(probes.use) == [0]


async def test_nothing_is_deleted_while_a_service_holds_a_start_past_the_setting_or_the_broker_refuses() -> None:
    a = _member("a")
    held = {a.id: QueueHeld(SESSION, (5, 1), heard_at=1.0)}
    placements: dict[uuid.UUID, Any] = {a.id: ((1, False, ()), 1)}
    probes = _Probes({0: (0, 1), 1: (0, 0)})
    retirement = Retirement(held, placements, _broker(probes))
    assert not await _delete(retirement, [a], 1, 2, 0.0)
    held[a.id] = QueueHeld(SESSION, (6,), heard_at=2.0)
    probes.refuse = True
    assert not await _delete(retirement, [a], 1, 2, 0.0)
    assert probes.deleted == []


@pytest.mark.parametrize("queue_held", [[], [3, 1]])
def test_a_heartbeat_names_its_queue_counts_only_when_it_has_them(queue_held: list[int]) -> None:
    heartbeat = ServiceHeartbeat(service_id=uuid.uuid4(), running=4, queue_held=queue_held)
    assert ("queue_held" in json.loads(heartbeat.encode())) == bool(queue_held)
    assert decode_state(heartbeat.encode()) == heartbeat


@pytest.mark.parametrize("retired", [False, True])
def test_starts_gone_says_retired_only_when_they_were(retired: bool) -> None:
    gone = StartsGone(
        service_id=uuid.uuid4(), session_id=SESSION, pools=["p"], observer_ids=[uuid.uuid4()], retired=retired
    )
    assert ("retired" in json.loads(gone.encode())) == retired
    assert decode_state(gone.encode()) == gone


def test_retire_starts_round_trips_on_the_control_stream() -> None:
    ask = RetireStarts(service_id=uuid.uuid4(), session_id=SESSION, keep=2, count=250)
    assert decode_control(ask.encode()) == ask


async def test_emptied_queues_are_deleted_only_once_they_stayed_empty_and_unconsumed_for_the_grace() -> None:
    a = _member("a")
    placements: dict[uuid.UUID, Any] = {a.id: ((1, False, ()), 1)}
    probes = _Probes({0: (0, 1), 1: (0, 0)})
    retirement = Retirement({}, placements, _broker(probes), delete_after_s=60.0)
    assert not await _delete(retirement, [a], 1, 2, 0.0)
    assert not await _delete(retirement, [a], 1, 2, 30.0)
    probes.use[1] = (1, 0)  # a manager with the old setting published to it: the wait starts again
    assert not await _delete(retirement, [a], 1, 2, 40.0)
    probes.use[1] = (0, 0)
    assert not await _delete(retirement, [a], 1, 2, 50.0)
    assert not await _delete(retirement, [a], 1, 2, 100.0)
    assert probes.deleted == []
    assert await _delete(retirement, [a], 1, 2, 110.0)
    assert probes.deleted == [1]


async def test_a_round_asks_the_broker_about_each_queue_past_the_setting_once_and_again_only_to_delete_it() -> None:
    a = _member("a")
    placements: dict[uuid.UUID, Any] = {a.id: ((1, False, ()), 1)}
    probes = _Probes({0: (0, 1), 1: (0, 0), 2: (0, 0)})
    retirement = Retirement({a.id: QueueHeld(SESSION, (4,), heard_at=1.0)}, placements, _broker(probes), 60.0)
    for now, deleted in ((0.0, False), (60.0, True)):
        probes.asked.clear()
        look = await retirement.look([a], {"p"}, keep=1, in_use=3)
        assert retirement.told(look) == 1
        assert await retirement.round([a], look, 10, _Sent()) == 0
        assert await retirement.delete_emptied(look, now) == deleted
        assert probes.asked == ([1, 2, 2, 1] if deleted else [1, 2])


async def test_the_broker_is_not_asked_while_a_start_is_held_past_the_setting() -> None:
    a = _member("a")
    probes = _Probes({0: (0, 1), 1: (0, 1)})
    retirement = Retirement(
        {a.id: QueueHeld(SESSION, (4, 1), heard_at=1.0)}, {a.id: ((1, False, ()), 2)}, _broker(probes)
    )
    look = await retirement.look([a], {"p"}, keep=1, in_use=2)
    assert retirement.told(look) == 2 and look.uses is None and probes.asked == []
