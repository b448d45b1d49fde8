from datetime import UTC, datetime, timedelta, timezone

import pytest

from manager.schedule import aware, new_schedule, problems

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_a_naive_time_is_refused_with_how_to_fix_it() -> None:
    with pytest.raises(ValueError, match="start_at: add a UTC offset"):
        aware(datetime(2026, 11, 29, 12, 0), "start_at")
    offset = datetime(2026, 11, 29, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert aware(offset, "start_at") == NOW
    assert aware(None, "stop_at") is None
    with pytest.raises(ValueError, match="stop_at: out of range"):
        aware(datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))), "stop_at")


def test_stop_at_and_run_for_are_exclusive() -> None:
    assert problems(None, NOW + timedelta(hours=1), 60.0, NOW) == ["stop_at, run_for_s: give one of them, not both"]


def test_the_stop_must_come_after_the_start() -> None:
    later = NOW + timedelta(hours=1)
    assert problems(later, later, None, NOW) == ["stop_at: must be after start_at"]
    assert problems(None, NOW - timedelta(seconds=1), None, NOW) == ["stop_at: is not in the future"]
    # A start_at in the past starts now: the stop must still be in the future.
    assert problems(NOW - timedelta(hours=2), NOW - timedelta(hours=1), None, NOW) == ["stop_at: is not in the future"]
    assert problems(later, later + timedelta(seconds=1), None, NOW) == []


def test_a_start_in_the_past_starts_now() -> None:
    assert new_schedule(NOW - timedelta(seconds=5), None, 30.0, NOW).start_at is None
    assert new_schedule(NOW, None, None, NOW).start_at is None
    future = new_schedule(NOW + timedelta(seconds=5), None, 30.0, NOW)
    assert (future.start_at, future.run_for_s) == (NOW + timedelta(seconds=5), 30.0)
