"""The statements of probation (``manager/state/probation.py`` holds the policy): a service's
death recorded (a ``host_deaths`` row, and ``host_lost`` for each observer it ran: names older
than "host" meaning only a machine), the deaths counted within a window, the room the budgets
leave, and who has run cleanly long enough to leave."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ColumnElement,
    CompoundSelect,
    Float,
    SQLColumnExpression,
    and_,
    cast,
    column,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    true,
    union,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from manager.db.counts import LIVE_TOTAL_SQL
from manager.db.models import EventType, HostDeath, Observer, ObserverEvent, ObserverStatus, Service
from manager.db.service_observers import on_service
from manager.db.sql import id_in
from shared.messages import RetryPolicy

_DEFAULT_RESET_AFTER_S = RetryPolicy().reset_after_s
_LIVE = (ObserverStatus.CREATED, ObserverStatus.PROCESSING, ObserverStatus.ON_DELETING)


async def last_session(session: AsyncSession, service_id: uuid.UUID) -> uuid.UUID | None:
    """The broker session ``service_id`` last spoke from."""
    return await session.scalar(select(Service.session_id).where(Service.id == service_id))


async def record_death(
    session: AsyncSession, service_id: uuid.UUID, last_heard: datetime, died_in: uuid.UUID | None, now: datetime
) -> int:
    """A ``host_lost`` event at ``now`` for each observer the death took a service from
    (``victims``), and the death's ``host_deaths`` row; returns how many events."""
    # One statement, in the database: the victims of a service's death are a third of a million
    # at 1,000,000, and reading their ids into the manager only to send them back as events
    # cost the state process seconds of a failover's CPU, which is all taken.
    victims = _victims(service_id, last_heard, died_in).subquery()
    recorded = (
        insert(ObserverEvent)
        .from_select(
            ["observer_id", "at", "event", "service_id"],
            select(
                victims.c.observer_id,
                literal(now, ObserverEvent.at.type),
                literal(EventType.HOST_LOST.value),
                literal(service_id, ObserverEvent.service_id.type),
            ).order_by(victims.c.observer_id),
        )
        .returning(ObserverEvent.observer_id)
        .cte("recorded")
    )
    # Not locked: writing an event locks nothing of its observer (no foreign key, migration
    # 0009), so it never waits for the consumer's FOR NO KEY UPDATE (``state/rows.py``).
    # Locked, the victims would make every start reported by the services taking them over wait
    # for the record of the death that caused it (docs/design.md, invariant 7).
    lost = await session.scalar(select(func.count()).select_from(recorded))
    await session.execute(insert(HostDeath).values(service_id=service_id, at=now))
    return lost or 0


async def deaths_since(session: AsyncSession, since: datetime) -> int:
    """The service deaths recorded after ``since`` whose services have not come back since."""
    deaths = await session.scalar(
        select(func.count())
        .select_from(HostDeath)
        .where(HostDeath.at > since, _not_back_since(HostDeath.service_id, HostDeath.at))
    )
    return deaths or 0


async def victim_ids(
    session: AsyncSession, service_id: uuid.UUID, last_heard: datetime, died_in: uuid.UUID | None
) -> set[uuid.UUID]:
    """The ids of the observers a death took a service from (``_victims``)."""
    return set(await session.scalars(_victims(service_id, last_heard, died_in)))


def _not_back_since(dead: Any, died_at: Any) -> ColumnElement[bool]:
    """The service of a death recorded at ``died_at`` has not spoken since: no heartbeat of its
    id came later (one whose row is gone with the retention did not come back either). Judged
    per death, not by the service's status now: in a flap of the whole fleet a service is lost
    again while another's death is recorded, and the death being recorded is its service's
    second under the same id."""
    return ~exists().where(Service.id == dead, Service.last_heartbeat_at > died_at)


def _victims(service_id: uuid.UUID, last_heard: datetime, died_in: uuid.UUID | None) -> CompoundSelect[uuid.UUID]:
    """The observers a death of ``service_id`` in broker session ``died_in`` (the one it last
    spoke from) took a service from: those moved away from that session since it was last heard
    of (the broker hands its starts over as its connection drops, before the death is
    judged) and those the rows still have in it.

    By session, not only by time: a move is recorded when the new service reports it, and that
    report can be applied after the old service, back from a partition under the same id, spoke
    from its next session. Such a move (and a row not yet moved) belongs to the session
    before, whose end the service survived; counted again here, one flap was two deaths
    (``tests/system/test_probation_rules.py``). A session not said (None, on either side: a service
    of an older version) matches any."""
    return union(
        select(ObserverEvent.observer_id).where(
            ObserverEvent.event == EventType.MOVED.value,
            ObserverEvent.from_service_id == service_id,
            ObserverEvent.at >= last_heard,
            _in_session(ObserverEvent.from_session_id, died_in),
        ),
        select(Observer.id).where(
            on_service(service_id),
            Observer.status == ObserverStatus.PROCESSING,
            _in_session(Observer.host_session_id, died_in),
        ),
    )


def _in_session(column: SQLColumnExpression[uuid.UUID | None], died_in: uuid.UUID | None) -> ColumnElement[bool]:
    if died_in is None:
        return true()
    return or_(column.is_(None), column == died_in)


async def losses_since_last_probation(
    session: AsyncSession, victims: Collection[uuid.UUID], since: datetime, at_least: int
) -> dict[uuid.UUID, int]:
    """``host_lost`` events after ``since`` (the same window start as the count of deaths
    that bounds them) and after the observer's last probation, per victim with at least
    ``at_least`` of them."""
    ended = aliased(ObserverEvent)
    last_ended = (
        select(func.max(ended.at))
        .where(ended.observer_id == ObserverEvent.observer_id, ended.event == EventType.PROBATION_ENDED.value)
        .scalar_subquery()
    )
    result = await session.execute(
        select(ObserverEvent.observer_id, func.count())
        .where(
            ObserverEvent.event == EventType.HOST_LOST.value,
            id_in(ObserverEvent.observer_id, victims),
            _not_back_since(ObserverEvent.service_id, ObserverEvent.at),
            ObserverEvent.at > since,
            ObserverEvent.at > func.coalesce(last_ended, literal("-infinity").cast(ObserverEvent.at.type)),
        )
        .group_by(ObserverEvent.observer_id)
        .having(func.count() >= at_least)
    )
    return {observer_id: count for observer_id, count in result.all()}


def served(now: datetime) -> ColumnElement[bool]:
    """Observers on probation that have run in a child, without a failure, for their retry
    policy's ``reset_after_s`` (the same measure of "stable" their retries use)."""
    reset_after = func.coalesce(cast(Observer.retry["reset_after_s"].astext, Float), _DEFAULT_RESET_AFTER_S)
    return and_(
        Observer.probation_since.is_not(None),
        Observer.status == ObserverStatus.PROCESSING,
        Observer.probation_clean_since.is_not(None),
        Observer.probation_clean_since < now - func.make_interval(0, 0, 0, 0, 0, 0, reset_after),
    )


async def forget_deaths(session: AsyncSession, before: datetime) -> None:
    """Delete the record of the service deaths before ``before``."""
    await session.execute(delete(HostDeath).where(HostDeath.at < before))


# The fleet's and each service's room for probation, in one round trip: live observers from the
# counts tables, those on probation through the partial index ix_observers_probation.
_ROOM = text(
    f"""
    WITH on_probation AS (
        SELECT service_id, count(*) AS n FROM observers
        WHERE probation_since IS NOT NULL AND status::text = ANY(:live) GROUP BY service_id
    )
    SELECT
        ({LIVE_TOTAL_SQL}) AS live,
        (SELECT coalesce(sum(n), 0) FROM on_probation) AS on_probation,
        (SELECT coalesce(json_object_agg(s.id, greatest(s.process_slots - coalesce(p.n, 0), 0)), '{{}}')
            FROM services s LEFT JOIN on_probation p ON p.service_id = s.id WHERE s.status = 'alive') AS slots
    """
).columns(column("live", BigInteger), column("on_probation", BigInteger), column("slots", JSON))


async def probation_room(session: AsyncSession) -> tuple[int, int, dict[uuid.UUID, int]]:
    """(live observers, those on probation now, each alive service's process slots not taken
    by an observer on probation it runs)."""
    row = (await session.execute(_ROOM, {"live": [s.value for s in _LIVE]})).one()
    return int(row.live), int(row.on_probation), {uuid.UUID(k): int(v) for k, v in row.slots.items()}


# Per observer: the service deaths it could have witnessed, the evidence's denominator. Those of
# the window after it existed and after its last probation ended, of services that served its
# pool (a service whose row is gone counts), and not come back since.
_WITNESSABLE = text(
    """
    SELECT o.id, count(d.id) AS n
    FROM observers AS o
    JOIN host_deaths AS d ON d.at > greatest(
        CAST(:since AS timestamptz), o.created_at,
        coalesce((SELECT max(e.at) FROM observer_events AS e
                  WHERE e.observer_id = o.id AND e.event = :ended), '-infinity'))
    LEFT JOIN services AS s ON s.id = d.service_id
    WHERE o.id = ANY(:ids)
      AND (s.id IS NULL OR (s.pools ? o.pool AND s.last_heartbeat_at <= d.at))
    GROUP BY o.id
    """
)


async def witnessable(session: AsyncSession, ids: Collection[uuid.UUID], since: datetime) -> dict[uuid.UUID, int]:
    """For each of ``ids``, the service deaths since ``since`` it could have witnessed."""
    params = {"ids": list(ids), "since": since, "ended": EventType.PROBATION_ENDED.value}
    return {oid: int(n) for oid, n in (await session.execute(_WITNESSABLE, params)).all()}
