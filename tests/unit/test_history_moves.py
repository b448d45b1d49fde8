"""``manager.history.moves``: failovers counted from the history's ids, including events
whose transaction committed after later ids were seen."""

from __future__ import annotations

from manager.history.moves import MoveCounter


def test_the_first_read_places_the_floor_at_the_end_of_the_history() -> None:
    counter = MoveCounter()
    assert counter.update(0.0, above_lo=500, above_next=500, max_id=1000) == 0  # the past is not counted
    assert counter.floors() == (1000, 1000)


def test_new_moves_are_the_increase_of_the_count_above_the_floor() -> None:
    counter = MoveCounter(settle_s=60)
    counter.update(0.0, 0, 0, max_id=100)
    assert counter.update(5.0, above_lo=3, above_next=3, max_id=110) == 3
    assert counter.update(10.0, above_lo=3, above_next=3, max_id=110) == 3
    assert counter.update(15.0, above_lo=7, above_next=7, max_id=120) == 7


def test_a_late_commit_below_the_highest_id_seen_is_still_counted() -> None:
    # Given ids 101-105 (moves) held by a transaction still open while 106-120 were read
    counter = MoveCounter(settle_s=60)
    counter.update(0.0, 0, 0, max_id=100)
    counter.update(5.0, above_lo=2, above_next=2, max_id=120)
    # When they commit: the count above the same floor grows by them
    assert counter.update(10.0, above_lo=7, above_next=7, max_id=120) == 7


def test_the_floor_moves_to_the_highest_id_seen_settle_s_ago() -> None:
    counter = MoveCounter(settle_s=60)
    counter.update(0.0, 0, 0, max_id=100)
    counter.update(30.0, 4, 4, max_id=200)
    assert counter.floors() == (100, 100)
    counter.update(61.0, 4, 4, max_id=300)  # the mark of 0 s is 60 s old: the next floor is 100
    counter.update(91.0, 6, 6, max_id=300)  # the mark of 30 s (id 200) is old enough now
    assert counter.floors() == (100, 200)
    # The read that moves the floor counts above the old one, then keeps the count above the new
    assert counter.update(96.0, above_lo=9, above_next=5, max_id=320) == 9
    assert counter.floors()[0] == 200
    assert counter.update(101.0, above_lo=6, above_next=6, max_id=330) == 10
