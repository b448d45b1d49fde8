"""Poison quarantine: an observer whose hosts keep dying while they run it is Failed and
stopped, so one bad job cannot take the fleet down service by service.

A host death is known late: a service is judged lost after ``lost_after_heartbeats`` silent
heartbeat intervals (or replaced at once when it restarts under the same name), and by then
the broker has long given its observers to other services. So every takeover is recorded as
a ``moved`` event (``from_service_id`` = the old host), and when a host is found dead, each
observer it was running (still there, or moved away from it since its last heartbeat) gets
a ``host_lost`` event. ``quarantine_after_crashes`` of those within
``quarantine_window_s`` → Failed ("crashed its host K times ...") and a broadcast stop,
which services also remember, so a start redelivered later is acked, not run.

A host that disconnects but lives on (broker restart, network blip) is never judged dead,
so its moves count for nothing. Limit: hosts that take the observer before the first death
is judged may die too; the damage is bounded by K plus what the detection delay lets through.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select

from manager.db.models import EventType, Observer, ObserverEvent, ObserverStatus
from manager.db.sql import id_in
from manager.state.rows import ObserverRows


@dataclass(frozen=True)
class QuarantinePolicy:
    after_crashes: int  # 0: never quarantine
    window_s: float


async def host_died(
    rows: ObserverRows, service_id: uuid.UUID, last_heard: datetime, now: datetime, policy: QuarantinePolicy
) -> list[uuid.UUID]:
    """Record that ``service_id`` died; return the observers now quarantined (to stop)."""
    session = rows.session
    await rows.flush()
    victims = set(
        await session.scalars(
            select(ObserverEvent.observer_id).where(
                ObserverEvent.event == EventType.MOVED.value,
                ObserverEvent.from_service_id == service_id,
                ObserverEvent.at >= last_heard,
            )
        )
    )
    victims |= set(
        await session.scalars(
            select(Observer.id).where(Observer.service_id == service_id, Observer.status == ObserverStatus.PROCESSING)
        )
    )
    for observer_id in victims:
        rows.event(observer_id, EventType.HOST_LOST, now, service_id=service_id)
    if not victims or policy.after_crashes <= 0:
        return []
    await rows.flush()
    counts = dict(
        (
            await session.execute(
                select(ObserverEvent.observer_id, func.count())
                .where(
                    ObserverEvent.event == EventType.HOST_LOST.value,
                    id_in(ObserverEvent.observer_id, victims),
                    ObserverEvent.at > now - timedelta(seconds=policy.window_s),
                )
                .group_by(ObserverEvent.observer_id)
                .having(func.count() >= policy.after_crashes)
            )
        ).all()
    )
    if not counts:
        return []
    quarantined = []
    live = Observer.status.in_((ObserverStatus.CREATED, ObserverStatus.PROCESSING))
    for row in await rows.load(id_in(Observer.id, counts) & live):
        reason = f"quarantined: crashed its host {counts[row.id]} times within {policy.window_s:g}s"
        row.status, row.last_error, row.modified_at = ObserverStatus.FAILED, reason, now
        rows.event(row.id, EventType.QUARANTINED, now, service_id=service_id, detail=reason)
        quarantined.append(row.id)
    return quarantined
