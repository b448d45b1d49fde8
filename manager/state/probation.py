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
  still says ``async``) is told again (``observer_reports.started``); a host with no free
  process slot keeps it paused, its delivery held, until one frees;
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
The policy is here; its statements are in ``manager/db/probation.py``.
The cost: a child is a whole interpreter (docs/design.md, "The observer runtime"), and
until the host gets ``IsolateObservers`` (one state-queue round trip after the start report)
a moved suspect runs in its host's process.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from manager.db import probation as probation_db
from manager.db.models import EventType, Observer, ObserverStatus
from manager.db.sql import id_in
from manager.state.rows import ObserverRows

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
    died_in = await probation_db.last_session(session, service_id)
    lost = await probation_db.record_death(session, service_id, last_heard, died_in, now)
    if not lost or policy.after_host_deaths <= 0:
        return {}
    # An observer loses at most one host per death: while fewer hosts died in the window
    # than the threshold, nobody can have reached it, and the count below (an index probe
    # per victim: seconds for a whole host's share, docs/cost-curve.md) is not needed. That
    # is every death of a healthy fleet; the count runs when deaths cluster.
    since = now - timedelta(seconds=policy.window_s)
    if await probation_db.deaths_since(session, since) < policy.after_host_deaths:
        return {}
    ids = await probation_db.victim_ids(session, service_id, last_heard, died_in)
    counts = await probation_db.losses_since_last_probation(session, ids, since, policy.after_host_deaths)
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


async def end_probations(rows: ObserverRows, now: datetime) -> list[uuid.UUID]:
    """Take off probation every observer that has run in a child, without a failure, for
    its retry policy's ``reset_after_s`` (the same measure of "stable" its retries use)."""
    ended = []
    for row in await rows.load(probation_db.served(now)):
        clean_s = (now - row.probation_clean_since).total_seconds() if row.probation_clean_since else 0.0
        row.probation_since, row.probation_clean_since = None, None
        rows.event(
            row.id, EventType.PROBATION_ENDED, now, service_id=row.service_id, detail=f"ran {clean_s:.0f}s in a child"
        )
        ended.append(row.id)
    return ended
