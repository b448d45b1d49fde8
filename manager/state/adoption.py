"""Adoption: an observer that runs with no row gets its row back (issue 11).

A database restored from an older backup does not know the observers created since; their
starts are held by services and they run. Stopping them (what the manager did) lost running
work. Now, after ``ORCH_UNKNOWN_GRACE_S`` (a create's commit may still be in flight), the
manager asks their service to describe them (``DescribeRequest``); the service answers with their
start messages (``ObserversDescribed``, only those it runs, tied to its session) and each is
adopted: its row re-created from the start message, Processing on that service, event
``adopted``. Two exceptions, stopped on that service with a logged reason instead:

* its name now belongs to another live observer (names are unique among live observers);
* its create was answered 503 and its row deleted while some starts may have reached the
  broker (``abandoned_observers``): the client was told it does not exist.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from manager.db import observers
from manager.db.models import EventType, ObserverStatus
from manager.state.follow_ups import FollowUps
from manager.state.rows import ObserverRows
from shared.messages import ObserversDescribed, StartObserver

logger = logging.getLogger(__name__)


async def adopt(
    session: AsyncSession, rows: ObserverRows, m: ObserversDescribed, now: datetime, out: FollowUps
) -> None:
    """Re-create the rows of the observers ``m`` describes, or stop them (see above). The
    sender must be a known service (it becomes their service)."""
    ids = [start.observer_id for start in m.starts]
    if not ids:
        return
    await rows.flush()
    existing = await observers.existing_ids(session, ids)
    abandoned = await observers.abandoned_ids(session, ids)
    taken: dict[str, object] = dict(await observers.live_owners(session, {start.name for start in m.starts}))
    adoptable: list[StartObserver] = []
    for start in m.starts:
        oid = start.observer_id
        if oid in existing:
            continue  # its row committed meanwhile: the usual rules apply
        if oid in abandoned:
            reason = "its create was answered 503: the client was told it does not exist"
        elif start.name in taken:
            reason = f"its name {start.name!r} now belongs to live observer {taken[start.name]}"
        else:
            taken[start.name] = oid
            adoptable.append(start)
            continue
        logger.warning("observer %s runs on %s with no row, not adopted: %s; stopping it", oid, m.service_id, reason)
        out.stop(oid, m.service_id, f"not adopted: {reason}", m.session_id)
    if not adoptable:
        return
    adopted = await observers.insert_adopted(session, [_row(start, m, now) for start in adoptable])
    detail = "found running with no row (a database restored from an older backup?): row made from its start"
    for oid in adopted:
        rows.event(oid, EventType.ADOPTED, now, service_id=m.service_id, detail=detail)
    if adopted:
        logger.warning("adopted %d observer(s) running on %s with no row", len(adopted), m.service_id)


def _row(start: StartObserver, m: ObserversDescribed, now: datetime) -> dict[str, object]:
    return {
        "id": start.observer_id,
        "name": start.name,
        "kind": start.kind,
        "args": start.args,
        "pool": start.pool,
        "status": ObserverStatus.PROCESSING,
        "service_id": m.service_id,
        "host_session_id": m.session_id,
        "attempts": 1,
        "retry": start.retry.model_dump(mode="json"),
        "isolation": start.isolation,
        "memory_limit_mb": start.memory_limit_mb,
        "created_at": now,
        "modified_at": now,
    }
