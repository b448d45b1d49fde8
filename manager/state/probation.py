"""Probation: blame by evidence, not by proximity (issue 11).

A service's death is weak evidence against the observers it ran: services die for reasons of
their own (the OOM killer, a crash-looping deploy, a machine reclaimed, an operator's ``kill -9``),
and then every one of its observers was merely nearby. Failing them turned an incident into
a permanent outage of healthy jobs. So a service's death never fails anyone. Instead:

* every takeover is recorded as a ``moved`` event (``from_service_id`` = the old service,
  ``from_session_id`` its broker session), and when a service is judged dead (lost, or replaced
  by a restart under its name) the death gets a ``host_deaths`` row and each observer it was
  running in the session it last spoke from (still there, or moved away since its last
  heartbeat) gets ``host_lost``, both at the same instant;
* ``after_service_deaths`` of those within ``window_s`` (counted since its last probation ended)
  make an observer a suspect, and a suspect goes on **probation** only if it also witnessed at
  least ``min_share`` of the service deaths it could have witnessed (of services serving its pool,
  while it existed, since its last probation): in an incident every observer witnesses some
  deaths, about one in the number of services, while a service killer witnesses nearly all of them;
* on probation, its service is told to run it in a child process of its own
  (``IsolateObservers``; the start delivery stays held, nothing moves). There a crash, a
  memory overrun or a hang is its own, and counts under its retry policy like any failure of
  its body: only an observer that keeps crashing its own child ends ``Failed``;
* probation has a **budget**: at most ``budget`` of the live observers at once (at least
  one), the strongest evidence first, and no service gets more than its free process slots;
  a suspect left out is counted (``orch_probation_deferred``), said once, and weighed again
  at its next service's death;
* a service that reports it started in its own process (a failover: the start message itself
  still says ``async``) is told again (``observer_reports.started``); a service with no free
  process slot keeps it paused, its delivery held, until one frees (the API shows it
  ``paused``, ``orch_observers_paused`` counts it, never plain Processing);
* it leaves probation once it has run in a child for its retry policy's ``reset_after_s``
  without a failure (``end_probations``, a repair of the background loop);
* a death counts only while its service has not come back. A service judged lost that speaks
  again under the same id is the same process: its session was cut (a network partition, a
  paused VM, a starved machine), it did not die, and nothing it ran is suspect (a frozen
  service says "no observer is to blame" when it wakes). Counted, three flaps of the fleet's
  network within the window put every healthy observer on probation, and those beyond the
  process slots waited, paused (``tools/partition.py``; ``tests/system/test_reliability.py``). A service
  that died (restarted under its name: a new id, the old one deleted) or never returned
  still counts. The ``host_lost`` events (named before "host" meant only a machine) stay in
  the history either way.

Why evidence and a budget rather than the count alone: counted alone, a long incident put
most of a small fleet on probation (24 of 40 bystanders in 120 s of chaos), each in a child
process, and at 10,000 observers a service most would wait paused for a slot, showing Processing.
No rule fails an observer on correlation: probation costs a child process for a while, so it
can afford to be wrong about a few.
The policy is here; its statements are in ``manager/db/probation.py``.
The cost: a child is a whole interpreter (docs/design.md, "The observer runtime"), and
until the service gets ``IsolateObservers`` (one state-queue round trip after the start report)
a moved suspect runs in its service's process.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from manager.db import probation as probation_rows
from manager.db.models import EventType, Observer, ObserverStatus
from manager.db.sql import id_in
from manager.metrics import PROBATION_DEFERRED
from manager.state.rows import ObserverRows, Row

logger = logging.getLogger(__name__)

_LIVE = (ObserverStatus.CREATED, ObserverStatus.PROCESSING, ObserverStatus.ON_DELETING)


@dataclass(frozen=True)
class ProbationPolicy:
    after_service_deaths: int  # 0: never (ORCH_PROBATION_AFTER_HOST_DEATHS)
    window_s: float
    # The share of the service deaths it could have witnessed (in its pool, while it existed) that
    # an observer must have witnessed: what sets a service killer apart from an incident's bystanders.
    min_share: float = 0.75
    # At most this share of the live observers on probation at once (at least one).
    budget: float = 0.05


async def service_died(
    rows: ObserverRows, service_id: uuid.UUID, last_heard: datetime, now: datetime, policy: ProbationPolicy
) -> dict[uuid.UUID, uuid.UUID]:
    """Record that ``service_id`` died; put on probation those whose services died too often.
    Returns {observer: its current live service} for the new probationers already running
    elsewhere, which that service must isolate now (the others are told when a service reports
    them started)."""
    session = rows.session
    await rows.flush()
    died_in = await probation_rows.last_session(session, service_id)
    lost = await probation_rows.record_death(session, service_id, last_heard, died_in, now)
    if not lost or policy.after_service_deaths <= 0:
        return {}
    # An observer loses at most one service per death: while fewer services died in the window
    # than the threshold, nobody can have reached it, and the count below (an index probe
    # per victim: seconds for a whole service's share, docs/cost-curve.md) is not needed. That
    # is every death of a healthy fleet; the count runs when deaths cluster.
    since = now - timedelta(seconds=policy.window_s)
    if await probation_rows.deaths_since(session, since) < policy.after_service_deaths:
        return {}
    ids = await probation_rows.victim_ids(session, service_id, last_heard, died_in)
    counts = await probation_rows.losses_since_last_probation(session, ids, since, policy.after_service_deaths)
    if not counts:
        return {}
    # Witnessing K deaths is not enough in an incident: most of the fleet does. A suspect
    # witnessed most of the deaths it could have (a bystander, about one in the number of services).
    could = await probation_rows.witnessable(session, counts, since)
    shares = {oid: n / max(n, could.get(oid, n)) for oid, n in counts.items()}
    suspects = {oid for oid, share in shares.items() if share >= policy.min_share}
    if not suspects:
        return {}
    isolate: dict[uuid.UUID, uuid.UUID] = {}
    # ``matching``, not ``load``: the victims are read by an array of ids, and a dead service's
    # share is moving while its death is recorded (``manager/state/rows.py``).
    live = await rows.matching(
        id_in(Observer.id, suspects) & Observer.status.in_(_LIVE),
        lambda row: row.id in suspects and row.status in _LIVE,
    )
    fresh = [row for row in live if row.probation_since is None]  # on probation, more deaths prove nothing
    for row in await _within_budgets(rows, fresh, shares, counts, service_id, policy):
        row.probation_since, row.probation_clean_since = now, None
        detail = (
            f"its services died {counts[row.id]} times within {policy.window_s:g}s while it ran, "
            f"{shares[row.id]:.0%} of the deaths it could have seen (last: {service_id}); it runs in "
            "a child process of its own until it has run cleanly there for its reset_after_s"
        )
        rows.event(row.id, EventType.PROBATION, now, service_id=row.service_id, detail=detail)
        current = row.service_id
        if row.status == ObserverStatus.PROCESSING and current is not None and current != service_id:
            isolate[row.id] = current
    return isolate


async def _within_budgets(
    rows: ObserverRows,
    fresh: list[Row],
    shares: dict[uuid.UUID, float],
    counts: dict[uuid.UUID, int],
    dead: uuid.UUID,
    policy: ProbationPolicy,
) -> list[Row]:
    """The suspects that go on probation: the strongest evidence first, while the fleet's
    budget has room and their current service a free process slot (one moving from the dead
    service has none yet: its next service pauses it if it has no slot). The rest are said, once."""
    if not fresh:
        return []
    live, on_probation, slots = await probation_rows.probation_room(rows.session)
    room = max(1, int(policy.budget * live)) - on_probation
    chosen: list[Row] = []
    for row in sorted(fresh, key=lambda r: (-shares[r.id], -counts[r.id], r.id)):
        current = row.service_id
        if room <= 0 or (current is not None and current != dead and slots.get(current, 1) <= 0):
            continue
        if current is not None and current in slots:
            slots[current] -= 1
        room -= 1
        chosen.append(row)
    if len(chosen) < len(fresh):
        PROBATION_DEFERRED.inc(len(fresh) - len(chosen))
        logger.warning(
            "%d suspect(s) of the death of %s not put on probation: the budget (ORCH_PROBATION_BUDGET: "
            "%d of %d live observers) or their services' process slots are taken; a next death weighs them again",
            len(fresh) - len(chosen),
            dead,
            max(1, int(policy.budget * live)),
            live,
        )
    return chosen


async def end_probations(rows: ObserverRows, now: datetime) -> list[uuid.UUID]:
    """Take off probation every observer that has run in a child, without a failure, for
    its retry policy's ``reset_after_s`` (the same measure of "stable" its retries use)."""
    ended = []
    for row in await rows.load(probation_rows.served(now)):
        clean_s = (now - row.probation_clean_since).total_seconds() if row.probation_clean_since else 0.0
        row.probation_since, row.probation_clean_since = None, None
        rows.event(
            row.id, EventType.PROBATION_ENDED, now, service_id=row.service_id, detail=f"ran {clean_s:.0f}s in a child"
        )
        ended.append(row.id)
    return ended
