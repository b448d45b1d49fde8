"""Observer history: append-only events written in the same transaction as the change they
describe, so the history never claims what the rows do not (and vice versa)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.models import EventType, ObserverEvent

_INSERT = text(
    """
    INSERT INTO observer_events (observer_id, at, event, service_id, from_service_id, detail)
    SELECT * FROM unnest(
        CAST(:observer_ids AS uuid[]), CAST(:ats AS timestamptz[]), CAST(:events AS text[]),
        CAST(:service_ids AS uuid[]), CAST(:from_ids AS uuid[]), CAST(:details AS text[])
    )
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


async def insert_events(session: AsyncSession, events: list[NewEvent]) -> None:
    """One statement for any number of events (a failover moves thousands at once)."""
    if not events:
        return
    await session.execute(
        _INSERT,
        {
            "observer_ids": [e.observer_id for e in events],
            "ats": [e.at for e in events],
            "events": [e.event.value for e in events],
            "service_ids": [e.service_id for e in events],
            "from_ids": [e.from_service_id for e in events],
            "details": [e.detail[:_MAX_DETAIL] if e.detail else None for e in events],
        },
    )


async def list_events(
    session: AsyncSession, observer_id: uuid.UUID, limit: int, after: int | None = None
) -> list[ObserverEvent]:
    """Oldest first; ``after`` is the id of the last event already seen."""
    query = select(ObserverEvent).where(ObserverEvent.observer_id == observer_id)
    if after is not None:
        query = query.where(ObserverEvent.id > after)
    return list(await session.scalars(query.order_by(ObserverEvent.id).limit(limit)))
