"""``manager.balance.plan``: what the balancer decides in one round."""

from __future__ import annotations

import uuid

from manager.balance.plan import Member, Move, Plan, drain_note, placement, plan
from manager.balance.rounds import Settle
from shared.messages import EVEN, OVER, UNDER


def levels(decided: Plan, pool: str) -> dict[uuid.UUID, int]:
    return {service: by_pool[pool] for service, by_pool in decided.priorities.items() if pool in by_pool}


def member(name: str, running: int, capacity: int = 1000, **kw: object) -> Member:
    return Member(uuid.uuid5(uuid.NAMESPACE_DNS, name), name, capacity, running, ("default",), **kw)  # type: ignore[arg-type]


def test_after_a_rolling_restart_the_full_one_hands_its_excess_to_the_empty_one() -> None:
    s1, s2, s3 = member("s1", 400), member("s2", 200), member("s3", 0)
    decided = plan([s1, s2, s3], tolerance=0.1)
    assert levels(decided, "default") == {s1.id: OVER, s2.id: EVEN, s3.id: UNDER}
    assert decided.moves == [Move(s1.id, "default", 200, "even load", (s3,))]  # to the under one
    assert decided.imbalance == 1.0  # s1 and s3 both 100 % off their share of 200


def test_moves_are_bounded_by_what_the_under_ones_lack() -> None:
    s1, s2, s3 = member("s1", 300), member("s2", 300), member("s3", 0)
    assert sum(m.count for m in plan([s1, s2, s3], 0.1).moves) == 200


def test_within_the_tolerance_or_by_one_observer_nothing_moves() -> None:
    assert plan([member("a", 105), member("b", 95)], 0.1).moves == []
    odd = plan([member("a", 3), member("b", 2), member("c", 2)], 0.1)  # 7 cannot split evenly
    assert odd.moves == [] and set(levels(odd, "default").values()) <= {EVEN, OVER, UNDER}


def test_shares_follow_capacity() -> None:
    big, small = member("big", 300, capacity=3000), member("small", 100, capacity=1000)
    assert plan([big, small], 0.1).moves == []  # both 10 % full
    skewed = plan([member("big", 100, capacity=3000), member("small", 300, capacity=1000)], 0.1)
    assert [(m.count, m.reason) for m in skewed.moves] == [(200, "even load")]


def test_a_service_whose_hand_over_is_in_flight_waits() -> None:
    s1, s3 = member("s1", 400, busy=True), member("s3", 0)
    assert plan([s1, s3], 0.1).moves == []


def test_a_drain_cordons_and_moves_what_the_others_can_take() -> None:
    draining = member("d", 100, draining=True)
    other = member("o", 50, capacity=120)
    decided = plan([draining, other], 0.1)
    assert decided.cordoned == {draining.id} and draining.id not in decided.priorities
    assert decided.moves == [Move(draining.id, "default", 70, "drain", (other,))]
    assert decided.drain_notes[draining.id] == (
        "handing over: 100 observer(s) left; the other services of pool default have room for 70 only"
    )
    roomy = member("r", 0, capacity=500)
    assert plan([draining, roomy], 0.1).drain_notes[draining.id] == "handing over: 100 observer(s) left"


def test_the_answer_to_a_drain_says_what_it_can_do_whatever_the_budget() -> None:
    draining, other = member("d", 100, draining=True), member("o", 50, capacity=120)
    assert drain_note([draining, other], draining.id).endswith("have room for 70 only")
    assert drain_note([member("e", 0, draining=True), other], member("e", 0).id) == "drained"


def test_a_drain_with_no_free_worker_elsewhere_says_so_and_moves_nothing() -> None:
    draining, full = member("d", 100, draining=True), member("o", 120, capacity=120)
    decided = plan([draining, full], 0.1)
    assert decided.moves == []
    assert decided.drain_notes[draining.id].startswith("waiting: the other services of pool default have no free")


def test_a_drained_service_says_so() -> None:
    decided = plan([member("d", 0, draining=True), member("o", 10)], 0.1)
    assert list(decided.drain_notes.values()) == ["drained"] and decided.moves == []


def test_a_service_in_two_pools_is_judged_in_each_by_what_it_runs_there() -> None:
    # "both" runs 20 in pool a and 60 in pool b: under in a (share 30), over in b (share 49)
    both = Member(uuid.uuid4(), "both", 100, 80, ("a", "b"), by_pool={"a": 20, "b": 60})
    only_a = Member(uuid.uuid4(), "only-a", 100, 40, ("a",))
    only_b = Member(uuid.uuid4(), "only-b", 100, 38, ("b",))
    decided = plan([both, only_a, only_b], 0.1)
    assert decided.priorities[both.id] == {"a": UNDER, "b": OVER}
    assert decided.priorities[only_a.id] == {"a": OVER} and decided.priorities[only_b.id] == {"b": UNDER}
    assert [(m.source, m.pool, m.count) for m in decided.moves] == [(only_a.id, "a", 10), (both.id, "b", 11)]
    # One priority per pool on the wire when they differ, one for all when they agree
    assert placement(decided, both.id) == (EVEN, False, (("a", UNDER), ("b", OVER)))
    assert placement(decided, only_a.id) == (OVER, False, ())


def test_a_drained_service_in_two_pools_moves_in_the_pool_where_its_observers_are() -> None:
    draining = Member(uuid.uuid4(), "d", 700, 200, ("a", "b"), draining=True, by_pool={"b": 200})
    in_a, in_b = Member(uuid.uuid4(), "in-a", 700, 0, ("a",)), Member(uuid.uuid4(), "in-b", 700, 0, ("b",))
    decided = plan([draining, in_a, in_b], 0.1)
    assert decided.moves == [Move(draining.id, "b", 200, "drain", (in_b,))]
    assert decided.drain_notes[draining.id] == "handing over: 200 observer(s) left"
    assert placement(decided, draining.id) == (EVEN, True, ())


def test_one_service_under_the_tolerance_is_filled_from_those_above_their_share_within_it() -> None:
    # As a rolling restart of 30,000 left it (bench.rebalance): nobody 10 % over, one 15 % under
    a, b, c = member("a", 10_952, 30_000), member("b", 10_548, 30_000), member("c", 8_500, 30_000)
    decided = plan([a, b, c], 0.1)
    assert levels(decided, "default") == {a.id: OVER, b.id: OVER, c.id: UNDER}
    assert sorted(m.count for m in decided.moves) == [548, 952]  # both down to 10,000, c up to it


def test_a_difference_the_starts_in_flight_explain_moves_nothing_and_places_evenly() -> None:
    # A second into a create of 100,000 on three services: the broker dealt them evenly, but
    # each service's reports had reached the rows at their own pace (bench, one node).
    a, b, c = member("a", 529, 100_000), member("b", 325, 100_000), member("c", 350, 100_000)
    assert plan([a, b, c], 0.1).moves  # as the rows alone say it
    decided = plan([a, b, c], 0.1, {"default": 3_000})
    assert decided.moves == [] and set(levels(decided, "default").values()) == {EVEN}
    assert decided.imbalance > 0.1  # still shown as it is


def test_an_empty_service_takes_a_burst_first_and_nothing_moves_onto_what_is_in_flight() -> None:
    full, joined = member("full", 9_000), member("joined", 0)
    decided = plan([full, joined], 0.1, {"default": 3_000})
    assert levels(decided, "default") == {full.id: OVER, joined.id: UNDER}
    # Its share is 4,500, of which the 3,000 in flight go to it first: 1,500 move, not 4,500
    assert decided.moves == [Move(full.id, "default", 1_500, "even load", (joined,))]
    # Within the starts in flight of its share it is even: the burst goes round again
    assert set(
        levels(plan([member("full", 9_000), member("joined", 7_000)], 0.1, {"default": 3_000}), "default").values()
    ) == {EVEN}


def test_starts_in_flight_of_another_pool_change_nothing() -> None:
    s1, s2, s3 = member("s1", 400), member("s2", 200), member("s3", 0)
    assert plan([s1, s2, s3], 0.1, {"gpu": 10_000}).moves == plan([s1, s2, s3], 0.1).moves != []


def test_a_pool_whose_placements_never_settle_still_moves_after_a_few_rounds() -> None:
    # Drain and uncordon requests flapping leave "default" unsettled every round; "gpu" is
    # unsettled twice. Each pool waits while unsettled, never more than three rounds running.
    settle = Settle(rounds=3)
    assert settle.held({"default"}) == {"default"}
    assert settle.held({"default", "gpu"}) == {"default", "gpu"}
    assert settle.held({"default", "gpu"}) == {"default", "gpu"}
    assert settle.held({"default"}) == set()
    assert settle.held({"default"}) == {"default"}
    assert settle.held(set()) == set()
    assert settle.held({"default"}) == {"default"}


def test_a_join_then_a_drain_a_round_later_both_hold_the_pool() -> None:
    # A service joins (its placement is new) and the next round a drain cordons another and
    # changes the takers' priorities: the pool waits both rounds (with the default cap).
    settle = Settle()
    assert settle.held({"default"}) == {"default"}
    assert settle.held({"default"}) == {"default"}
    assert settle.held(set()) == set()
