"""The rules of a schedule (``start_at``, ``stop_at``, ``run_for_s``), apart from any I/O:
what the API refuses (422) and what a create stores. Who fires a schedule, and why it is
never lost nor fired twice: ``manager/state/scheduler.py``."""

from __future__ import annotations

from datetime import UTC, datetime

from manager.db.creates import NewSchedule

EXAMPLE = "2026-12-01T09:30:00Z"


def aware(value: datetime | None, field: str) -> datetime | None:
    """``value`` in UTC if it carries an offset; a naive time is ambiguous (whose local time?)."""
    if value is None:
        return None
    if value.utcoffset() is None:
        raise ValueError(f"{field}: add a UTC offset to the time, e.g. {EXAMPLE} or +02:00 (RFC 3339)")
    try:
        return value.astimezone(UTC)
    except OverflowError:  # year 1 or 9999 with an offset that leaves datetime's range
        raise ValueError(f"{field}: out of range") from None


def problems(start_at: datetime | None, stop_at: datetime | None, run_for_s: float | None, now: datetime) -> list[str]:
    """Why these times cannot make a schedule (empty if they can). A start_at in the past is
    fine: the observer starts now."""
    found = []
    if stop_at is not None and run_for_s is not None:
        found.append("stop_at, run_for_s: give one of them, not both")
    if stop_at is not None and stop_at <= max(start_at or now, now):
        found.append(
            "stop_at: must be after start_at"
            if start_at is not None and start_at > now
            else "stop_at: is not in the future"
        )
    return found


def too_far(start_at: datetime | None, now: datetime, max_ahead_days: float) -> str | None:
    """Why ``start_at`` is too far ahead, if it is: a Scheduled observer holds its pool's
    worker from its create, so year 9999 would hold one for ever."""
    if start_at is None or (start_at - now).total_seconds() <= max_ahead_days * 86_400:
        return None
    return f"start_at: at most {max_ahead_days:g} days ahead (ORCH_SCHEDULE_MAX_AHEAD_DAYS)"


def new_schedule(
    start_at: datetime | None, stop_at: datetime | None, run_for_s: float | None, now: datetime
) -> NewSchedule:
    """What a create stores: Scheduled only for a start_at still to come (a past one starts
    now). ``run_for_s`` becomes a stop_at when the observer starts (at create, or when due)."""
    return NewSchedule(start_at if start_at is not None and start_at > now else None, stop_at, run_for_s)
