"""Observer history (``observer_events``): append-only events written in the same transaction
as the change they describe, so the history never claims what the rows do not (and vice
versa); read a page at a time, and deleted past the retention window
(``manager/repairs/retention.py``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.models import EventType, ObserverEvent
from manager.db.sql import factor

# Events are sent as their ids and, for each, the number of its (at, event, service_id,
# from_service_id, from_session_id, detail) among the batch's distinct ones (``manager.db.sql.factor``);
# inserted in the order given, so one observer's events get ascending ids as they happened.
_INSERT = text(
    """
    INSERT INTO observer_events (observer_id, at, event, service_id, from_service_id, from_session_id, detail)
    SELECT e.observer_id, d.at, d.event, d.service_id, d.from_service_id, d.from_session_id, d.detail
    FROM unnest(CAST(:observer_ids AS uuid[]), CAST(:keys AS integer[])) WITH ORDINALITY AS e(observer_id, k, n)
    JOIN unnest(
        CAST(:ats AS timestamptz[]), CAST(:events AS text[]), CAST(:service_ids AS uuid[]),
        CAST(:from_ids AS uuid[]), CAST(:from_sessions AS uuid[]), CAST(:details AS text[])
    ) WITH ORDINALITY AS d(at, event, service_id, from_service_id, from_session_id, detail, k) USING (k)
    ORDER BY e.n
    """
)

_MAX_DETAIL = 2000


@dataclass(frozen=True, slots=True)
class NewEvent:
    observer_id: uuid.UUID
    event: EventType
    at: datetime
    service_id: uuid.UUID | None = None
    from_service_id: uuid.UUID | None = None
    detail: str | None = None
    from_session_id: uuid.UUID | None = None


async def insert_events(session: AsyncSession, events: list[NewEvent]) -> None:
    """One statement for any number of events (a failover moves thousands at once)."""
    if not events:
        return
    keys, (ats, kinds, service_ids, from_ids, from_sessions, details) = factor(events, _described)
    await session.execute(
        _INSERT,
        {
            "observer_ids": [e.observer_id for e in events],
            "keys": keys,
            "ats": ats,
            "events": kinds,
            "service_ids": service_ids,
            "from_ids": from_ids,
            "from_sessions": from_sessions,
            "details": details,
        },
    )


def _described(e: NewEvent) -> tuple[Any, ...]:
    """What an event says besides whose it is."""
    detail = e.detail[:_MAX_DETAIL] if e.detail else None
    return e.at, e.event.value, e.service_id, e.from_service_id, e.from_session_id, detail


async def list_events(
    session: AsyncSession, observer_id: uuid.UUID, limit: int, after: int | None = None
) -> list[ObserverEvent]:
    """Oldest first; ``after`` is the id of the last event already seen."""
    query = select(ObserverEvent).where(ObserverEvent.observer_id == observer_id)
    if after is not None:
        query = query.where(ObserverEvent.id > after)
    return list(await session.scalars(query.order_by(ObserverEvent.id).limit(limit)))


# The table is append-only, so its ids follow time: the lowest ids are read through the
# primary key (no index on ``at`` needed), up to the first one inside the window.
_DELETE_OLDEST = text(
    """
    WITH oldest AS (SELECT id, at FROM observer_events ORDER BY id LIMIT :batch),
         expired AS (
             SELECT id FROM oldest
             WHERE id < coalesce((SELECT min(id) FROM oldest WHERE at >= :cutoff), 9223372036854775807)
         )
    DELETE FROM observer_events WHERE id IN (SELECT id FROM expired)
    """
)


async def delete_oldest(session: AsyncSession, cutoff: datetime, batch: int) -> int:
    """Delete the events older than ``cutoff`` among the ``batch`` oldest; returns how many."""
    result = await session.execute(_DELETE_OLDEST, {"batch": batch, "cutoff": cutoff})
    return int(getattr(result, "rowcount", 0) or 0)
