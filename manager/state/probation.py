"""Probation: blame by evidence, not by proximity (issue 11).

A host death is weak evidence against the observers it ran: hosts die for reasons of their
own (the OOM killer, a crash-looping deploy, a machine reclaimed, an operator's ``kill -9``),
and then every one of its observers was merely nearby. Failing them turned an incident into
a permanent outage of healthy jobs. So a host death never fails anyone. Instead:

* every takeover is recorded as a ``moved`` event (``from_service_id`` = the old host,
  ``from_session_id`` its broker session), and when a host is judged dead (lost, or replaced
  by a restart under its name) the death gets a ``host_deaths`` row and each observer it was
  running in the session it last spoke from (still there, or moved away since its last
  heartbeat) gets ``host_lost``, both at the same instant;
* ``after_host_deaths`` of those within ``window_s`` (counted since its last probation ended)
  put the observer on **probation**: its host is told to run it in a child process of its own
  (``IsolateObservers``; the start delivery stays held, nothing moves). There a crash, a
  memory overrun or a hang is its own, and counts under its retry policy like any failure of
  its body: only an observer that keeps crashing its own child ends ``Failed``;
* a host that reports it started in its own process (a failover: the start message itself
  still says ``async``) is told again (``rules._started``); a host with no free process slot
  keeps it paused, its delivery held, until one frees;
* it leaves probation once it has run in a child for its retry policy's ``reset_after_s``
  without a failure (``end_probations``, a repair of the background loop);
* a death counts only while its host has not come back. A service judged lost that speaks
  again under the same id is the same process: its session was cut (a network partition, a
  paused VM, a starved host), it did not die, and nothing it ran is suspect (a frozen
  service says "no observer is to blame" when it wakes). Counted, three flaps of the fleet's
  network within the window put every healthy observer on probation, and those beyond the
  process slots waited, paused (``tools/partition.py``; ``tests/system/test_reliability.py``). A host
  that died (restarted under its name: a new id, the old one deleted) or never returned
  still counts. The ``host_lost`` events stay in the history either way.

Why not a cleverer statistic (e.g. "was present at nearly every death in the fleet")? Any
rule that fails an observer on correlation alone fails some healthy one in a long enough
incident; probation costs a child process for a while, so it can afford to be wrong.
The cost: a child is a whole interpreter (docs/design.md, "The observer runtime"), and
until the host gets ``IsolateObservers`` (one state-queue round trip after the start report)
a moved suspect runs in its host's process.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    Float,
    SQLColumnExpression,
    and_,
    cast,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    union,
)
from sqlalchemy.orm import aliased

from manager.db.hosts import hosted_on
from manager.db.models import EventType, HostDeath, Observer, ObserverEvent, ObserverStatus, Service
from manager.db.sql import id_in
from manager.state.rows import ObserverRows
from shared.messages import RetryPolicy

_DEFAULT_RESET_AFTER_S = RetryPolicy().reset_after_s
_LIVE = (ObserverStatus.CREATED, ObserverStatus.PROCESSING, ObserverStatus.ON_DELETING)


@dataclass(frozen=True)
class ProbationPolicy:
    after_host_deaths: int  # 0: never
    window_s: float


async def host_died(
    rows: ObserverRows, service_id: uuid.UUID, last_heard: datetime, now: datetime, policy: ProbationPolicy
) -> dict[uuid.UUID, uuid.UUID]:
    """Record that ``service_id`` died; put on probation those whose hosts died too often.
    Returns {observer: its current live host} for the new probationers already running
    elsewhere, whom that host must isolate now (the others are told when a host reports
    them started)."""
    session = rows.session
    await rows.flush()
    died_in = await session.scalar(select(Service.session_id).where(Service.id == service_id))
    # One statement, in the database: the victims of a host's death are a third of a million
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
    # 0009), so it never waits for the consumer's FOR NO KEY UPDATE (rows.py). Locked, the
    # victims would make every start reported by the hosts taking them over wait for the
    # record of the death that caused it (docs/design.md, invariant 7).
    lost = await session.scalar(select(func.count()).select_from(recorded))
    await session.execute(insert(HostDeath).values(service_id=service_id, at=now))
    if not lost or policy.after_host_deaths <= 0:
        return {}
    # An observer loses at most one host per death: while fewer hosts died in the window
    # than the threshold, nobody can have reached it, and the count below (an index probe
    # per victim: seconds for a whole host's share, docs/cost-curve.md) is not needed. That
    # is every death of a healthy fleet; the count runs when deaths cluster.
    since = now - timedelta(seconds=policy.window_s)
    deaths = await session.scalar(
        select(func.count())
        .select_from(HostDeath)
        .where(HostDeath.at > since, _not_back_since(HostDeath.service_id, HostDeath.at))
    )
    if (deaths or 0) < policy.after_host_deaths:
        return {}
    ids = set(await session.scalars(_victims(service_id, last_heard, died_in)))
    counts = await _deaths_since_last_probation(rows, ids, since, policy)
    if not counts:
        return {}
    isolate: dict[uuid.UUID, uuid.UUID] = {}
    # ``matching``, not ``load``: the victims are read by an array of ids, and a host's share
    # is moving while its death is recorded (``manager/state/rows.py``).
    live = await rows.matching(
        id_in(Observer.id, counts) & Observer.status.in_(_LIVE), lambda row: row.id in counts and row.status in _LIVE
    )
    for row in live:
        if row.probation_since is not None:
            continue  # already on probation: a death of a host it ran on proves nothing more
        row.probation_since, row.probation_clean_since = now, None
        detail = (
            f"its hosts died {counts[row.id]} times within {policy.window_s:g}s while it ran "
            f"(last: {service_id}); it runs in a child process of its own until it has run "
            "cleanly there for its reset_after_s"
        )
        rows.event(row.id, EventType.PROBATION, now, service_id=row.service_id, detail=detail)
        host = row.service_id
        if row.status == ObserverStatus.PROCESSING and host is not None and host != service_id:
            isolate[row.id] = host
    return isolate


def _not_back_since(host: Any, died_at: Any) -> ColumnElement[bool]:
    """The host of a death recorded at ``died_at`` has not spoken since: no heartbeat of its
    id came later (one whose row is gone with the retention did not come back either). Judged
    per death, not by the host's status now: in a flap of the whole fleet a host is lost
    again while another's death is recorded, and the death being recorded is its host's
    second under the same id."""
    return ~exists().where(Service.id == host, Service.last_heartbeat_at > died_at)


def _victims(service_id: uuid.UUID, last_heard: datetime, died_in: uuid.UUID | None) -> CompoundSelect[uuid.UUID]:
    """The observers a death of ``service_id`` in broker session ``died_in`` (the one it last
    spoke from) took a host from: those moved away from that session since it was last heard
    of (the broker hands its starts over as its connection drops, before the death is
    judged) and those the rows still have in it.

    By session, not only by time: a move is recorded when the new host reports it, and that
    report can be applied after the old host, back from a partition under the same id, spoke
    from its next session. Such a move (and a row not yet moved) belongs to the session
    before, whose end the host survived; counted again here, one flap was two deaths
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
            hosted_on(service_id),
            Observer.status == ObserverStatus.PROCESSING,
            _in_session(Observer.host_session_id, died_in),
        ),
    )


def _in_session(column: SQLColumnExpression[uuid.UUID | None], died_in: uuid.UUID | None) -> ColumnElement[bool]:
    if died_in is None:
        return true()
    return or_(column.is_(None), column == died_in)


async def _deaths_since_last_probation(
    rows: ObserverRows, victims: set[uuid.UUID], since: datetime, policy: ProbationPolicy
) -> dict[uuid.UUID, int]:
    """``host_lost`` events after ``since`` (the same window start as the count of deaths
    that bounds them) and after the observer's last probation, per victim at the threshold."""
    ended = aliased(ObserverEvent)
    last_ended = (
        select(func.max(ended.at))
        .where(ended.observer_id == ObserverEvent.observer_id, ended.event == EventType.PROBATION_ENDED.value)
        .scalar_subquery()
    )
    result = await rows.session.execute(
        select(ObserverEvent.observer_id, func.count())
        .where(
            ObserverEvent.event == EventType.HOST_LOST.value,
            id_in(ObserverEvent.observer_id, victims),
            _not_back_since(ObserverEvent.service_id, ObserverEvent.at),
            ObserverEvent.at > since,
            ObserverEvent.at > func.coalesce(last_ended, literal("-infinity").cast(ObserverEvent.at.type)),
        )
        .group_by(ObserverEvent.observer_id)
        .having(func.count() >= policy.after_host_deaths)
    )
    return {observer_id: count for observer_id, count in result.all()}


async def end_probations(rows: ObserverRows, now: datetime) -> list[uuid.UUID]:
    """Take off probation every observer that has run in a child, without a failure, for
    its retry policy's ``reset_after_s`` (the same measure of "stable" its retries use)."""
    reset_after = func.coalesce(cast(Observer.retry["reset_after_s"].astext, Float), _DEFAULT_RESET_AFTER_S)
    due = and_(
        Observer.probation_since.is_not(None),
        Observer.status == ObserverStatus.PROCESSING,
        Observer.probation_clean_since.is_not(None),
        Observer.probation_clean_since < now - func.make_interval(0, 0, 0, 0, 0, 0, reset_after),
    )
    ended = []
    for row in await rows.load(due):
        clean_s = (now - row.probation_clean_since).total_seconds() if row.probation_clean_since else 0.0
        row.probation_since, row.probation_clean_since = None, None
        rows.event(
            row.id, EventType.PROBATION_ENDED, now, service_id=row.service_id, detail=f"ran {clean_s:.0f}s in a child"
        )
        ended.append(row.id)
    return ended
