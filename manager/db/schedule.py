"""The scheduler's statements (``manager/state/scheduler.py``): due rows found through the
partial indexes of migration 0016, taken in batches, each batch changed with its history
and (for starts) its pending starts in one statement.

Rows are locked ``FOR NO KEY UPDATE SKIP LOCKED``: a row another writer holds (a stop, a
reschedule, the state consumer) is left for the next pass, never waited for, so the
scheduler never deadlocks with the writers that lock in id order. The due rows are taken in
time order (the index's), so the most overdue go first.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.models import EventType, ObserverStatus
from manager.errors import Conflict, Invalid, NotFound

S = ObserverStatus

# Which Scheduled rows are due: read through ix_observers_due_start. A row whose stop time
# passed too (a manager down across both) is left to the expiry, which deletes it unstarted.
DUE_STARTS_SQL = """
    SELECT id FROM observers
    WHERE status = 'Scheduled' AND start_at <= :now AND (stop_at IS NULL OR stop_at > :now)
    ORDER BY start_at LIMIT :limit
"""
# Which rows are to be stopped: read through ix_observers_due_stop.
DUE_STOPS_SQL = """
    SELECT id, status FROM observers
    WHERE stop_at IS NOT NULL AND stop_at <= :now AND status IN ('Scheduled', 'Created', 'Processing')
    ORDER BY stop_at LIMIT :limit
"""

# The next time either index says something is due: the first entry of each, no scan.
NEXT_DUE = text(
    """
    SELECT least(
        (SELECT min(start_at) FROM observers WHERE status = 'Scheduled'),
        (SELECT min(stop_at) FROM observers
         WHERE stop_at IS NOT NULL AND status IN ('Scheduled', 'Created', 'Processing'))
    )
    """
)


async def next_due(session: AsyncSession) -> datetime | None:
    """When the next scheduled start or stop is due (None: nothing is scheduled)."""
    found: datetime | None = (await session.execute(NEXT_DUE)).scalar()
    return found


# Scheduled → Created, exactly as a create inserts it: a pending start (the pending-start
# repair publishes it if this manager dies before the broker confirmed it) and an event.
_START_DUE = text(
    f"""
    WITH due AS ({DUE_STARTS_SQL} FOR NO KEY UPDATE SKIP LOCKED),
    started AS (
        UPDATE observers AS o
        SET status = 'Created', modified_at = :now,
            stop_at = coalesce(o.stop_at, CAST(:now AS timestamptz) + o.run_for_s * interval '1 second')
        FROM due WHERE o.id = due.id
        RETURNING o.id, o.name, o.kind, o.args, o.pool, o.retry, o.isolation, o.memory_limit_mb, o.life, o.start_at
    ), pending AS (
        INSERT INTO pending_starts (observer_id, created_at) SELECT id, :now FROM started
    ), history AS (
        INSERT INTO observer_events (observer_id, at, event, detail)
        SELECT id, :now, :event, 'start_at ' || to_char(start_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
        FROM started
    )
    SELECT id, name, kind, args, pool, retry, isolation, memory_limit_mb, life FROM started
    """
)

# Created and Processing → OnDeleting (the stop is then published, as an API stop is);
# Scheduled → Deleted (nothing was published for it). Each gets an ``expired`` event.
_EXPIRE_DUE = text(
    f"""
    WITH due AS ({DUE_STOPS_SQL} FOR NO KEY UPDATE SKIP LOCKED),
    changed AS (
        UPDATE observers AS o
        SET status = CASE WHEN due.status = 'Scheduled' THEN 'Deleted' ELSE 'OnDeleting' END::observer_status,
            modified_at = :now
        FROM due WHERE o.id = due.id
        RETURNING o.id, due.status AS was, o.life
    ), history AS (
        INSERT INTO observer_events (observer_id, at, event, detail)
        SELECT id, :now, :event, CASE WHEN was = 'Scheduled' THEN 'stop_at came before its start' END FROM changed
    )
    SELECT id, was::text, life FROM changed
    """
)


# A due row whose start cannot be built is set aside: Failed, its pending start gone, an event
# saying why.
_SET_ASIDE = text(
    """
    WITH broken AS (SELECT * FROM unnest(CAST(:ids AS uuid[]), CAST(:errors AS text[])) AS b(id, error)),
    failed AS (
        UPDATE observers AS o SET status = 'Failed', last_error = broken.error, modified_at = :now
        FROM broken WHERE o.id = broken.id
        RETURNING o.id, broken.error
    ), pending AS (
        DELETE FROM pending_starts WHERE observer_id IN (SELECT id FROM failed)
    )
    INSERT INTO observer_events (observer_id, at, event, detail) SELECT id, :now, :event, error FROM failed
    """
)


async def take_due(session: AsyncSession, now: datetime, limit: int) -> Sequence[Row[Any]]:
    """Up to ``limit`` due Scheduled rows made Created with a pending start each, with the
    columns a start is built from (``manager.start_messages.start_message``)."""
    return (await session.execute(_START_DUE, {"now": now, "limit": limit, "event": EventType.DUE.value})).all()


async def set_aside(session: AsyncSession, broken: list[tuple[uuid.UUID, str]], now: datetime) -> None:
    """Taken rows whose start cannot be built, made Failed with the reason (id, reason)."""
    values = {"ids": [i for i, _ in broken], "errors": [e for _, e in broken]}
    await session.execute(_SET_ASIDE, values | {"now": now, "event": EventType.FAILED.value})


async def expire_due(
    session: AsyncSession, now: datetime, limit: int
) -> tuple[list[tuple[uuid.UUID, int]], list[uuid.UUID]]:
    """Up to ``limit`` rows whose stop time came: (id, life) of those now OnDeleting (their
    stops to publish after the commit), and the ids of the Scheduled ones now Deleted."""
    rows = (await session.execute(_EXPIRE_DUE, {"now": now, "limit": limit, "event": EventType.EXPIRED.value})).all()
    stopping = [(oid, life) for oid, was, life in rows if was != S.SCHEDULED.value]
    deleted = [oid for oid, was, _ in rows if was == S.SCHEDULED.value]
    return stopping, deleted


_RESCHEDULE = text(
    """
    UPDATE observers SET start_at = :start_at, modified_at = :now
    WHERE id = :id AND status = 'Scheduled'
    RETURNING stop_at
    """
)


async def reschedule(session: AsyncSession, observer_id: uuid.UUID, start_at: datetime, now: datetime) -> None:
    """A Scheduled row's new start time (a compare-and-set on its status): ``NotFound``, or
    ``Conflict`` when it is no longer Scheduled or its stop_at would come first."""
    row = (await session.execute(_RESCHEDULE, {"id": observer_id, "start_at": start_at, "now": now})).first()
    if row is None:
        status = (
            await session.execute(text("SELECT status::text FROM observers WHERE id = :id"), {"id": observer_id})
        ).scalar()
        if status is None:
            raise NotFound(f"no observer with id {observer_id}")
        raise Conflict(f"observer {observer_id} is {status}; only a Scheduled observer can be rescheduled")
    if row.stop_at is not None and row.stop_at <= start_at:
        raise Invalid(f"start_at: observer {observer_id} stops at {row.stop_at.isoformat()}; start it before that")
