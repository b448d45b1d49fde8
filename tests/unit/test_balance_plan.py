"""``manager.balance.plan``: what the balancer decides in one round."""

from __future__ import annotations

import uuid

from manager.balance.plan import EVEN, OVER, UNDER, Member, Move, drain_note, plan


def member(name: str, running: int, capacity: int = 1000, **kw: object) -> Member:
    return Member(uuid.uuid5(uuid.NAMESPACE_DNS, name), name, capacity, running, ("default",), **kw)  # type: ignore[arg-type]


def test_after_a_rolling_restart_the_full_one_hands_its_excess_to_the_empty_one() -> None:
    s1, s2, s3 = member("s1", 400), member("s2", 200), member("s3", 0)
    decided = plan([s1, s2, s3], tolerance=0.1, budget=1000)
    assert decided.priorities == {s1.id: OVER, s2.id: EVEN, s3.id: UNDER}
    assert decided.moves == [Move(s1.id, "default", 200, "even load", (s3,))]  # to the under one
    assert decided.imbalance == 1.0  # s1 and s3 both 100 % off their share of 200


def test_moves_are_bounded_by_the_budget_and_by_what_the_under_ones_lack() -> None:
    s1, s2, s3 = member("s1", 300), member("s2", 300), member("s3", 0)
    assert sum(m.count for m in plan([s1, s2, s3], 0.1, budget=50).moves) == 50
    assert sum(m.count for m in plan([s1, s2, s3], 0.1, budget=1000).moves) == 200


def test_within_the_tolerance_or_by_one_observer_nothing_moves() -> None:
    assert plan([member("a", 105), member("b", 95)], 0.1, 1000).moves == []
    odd = plan([member("a", 3), member("b", 2), member("c", 2)], 0.1, 1000)  # 7 cannot split evenly
    assert odd.moves == [] and set(odd.priorities.values()) <= {EVEN, OVER, UNDER}


def test_shares_follow_capacity() -> None:
    big, small = member("big", 300, capacity=3000), member("small", 100, capacity=1000)
    assert plan([big, small], 0.1, 1000).moves == []  # both 10 % full
    skewed = plan([member("big", 100, capacity=3000), member("small", 300, capacity=1000)], 0.1, 1000)
    assert [(m.count, m.reason) for m in skewed.moves] == [(200, "even load")]


def test_a_service_whose_hand_over_is_in_flight_waits() -> None:
    s1, s3 = member("s1", 400, busy=True), member("s3", 0)
    assert plan([s1, s3], 0.1, 1000).moves == []


def test_a_drain_cordons_and_moves_what_the_others_can_take() -> None:
    draining = member("d", 100, draining=True)
    other = member("o", 50, capacity=120)
    decided = plan([draining, other], 0.1, budget=1000)
    assert decided.cordoned == {draining.id} and draining.id not in decided.priorities
    assert decided.moves == [Move(draining.id, "default", 70, "drain", (other,))]
    assert decided.drain_notes[draining.id] == (
        "handing over: 100 observer(s) left; the other services of pool default have room for 70 only"
    )
    roomy = member("r", 0, capacity=500)
    assert plan([draining, roomy], 0.1, budget=10).drain_notes[draining.id] == "handing over: 100 observer(s) left"


def test_the_answer_to_a_drain_says_what_it_can_do_whatever_the_budget() -> None:
    draining, other = member("d", 100, draining=True), member("o", 50, capacity=120)
    assert drain_note([draining, other], draining.id).endswith("have room for 70 only")
    assert drain_note([member("e", 0, draining=True), other], member("e", 0).id) == "drained"


def test_a_drain_with_no_free_worker_elsewhere_says_so_and_moves_nothing() -> None:
    draining, full = member("d", 100, draining=True), member("o", 120, capacity=120)
    decided = plan([draining, full], 0.1, 1000)
    assert decided.moves == []
    assert decided.drain_notes[draining.id].startswith("waiting: the other services of pool default have no free")


def test_a_drained_service_says_so() -> None:
    decided = plan([member("d", 0, draining=True), member("o", 10)], 0.1, 1000)
    assert list(decided.drain_notes.values()) == ["drained"] and decided.moves == []


def test_a_service_in_two_pools_takes_its_priority_from_the_pool_where_it_is_furthest_off() -> None:
    both = Member(uuid.uuid4(), "both", 100, 60, ("a", "b"))
    only_a = Member(uuid.uuid4(), "only-a", 100, 20, ("a",))
    only_b = Member(uuid.uuid4(), "only-b", 100, 58, ("b",))
    decided = plan([both, only_a, only_b], 0.1, 1000)
    assert decided.priorities[both.id] == OVER  # 50 % over in pool a, even in pool b
    assert decided.priorities[only_a.id] == UNDER and decided.priorities[only_b.id] == EVEN


def test_one_service_under_the_tolerance_is_filled_from_those_above_their_share_within_it() -> None:
    # As a rolling restart of 30,000 left it (bench.rebalance): nobody 10 % over, one 15 % under
    a, b, c = member("a", 10_952, 30_000), member("b", 10_548, 30_000), member("c", 8_500, 30_000)
    decided = plan([a, b, c], 0.1, budget=10_000)
    assert decided.priorities == {a.id: OVER, b.id: OVER, c.id: UNDER}
    assert sorted(m.count for m in decided.moves) == [548, 952]  # both down to 10,000, c up to it
