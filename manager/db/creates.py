"""The one statement of a create: observer rows (Created, or Scheduled for a start_at),
their pending starts and their history, from one set of arrays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import pydantic_core
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.models import EventType, ObserverStatus
from shared.messages import StartObserver

S = ObserverStatus

# Observers, their pending starts and their "created" events, from one set of arrays. The
# ORM's executemany of the same rows was far slower on bulk creates (docs/design.md, "Where
# the time goes").
_INSERT_CREATED = text(
    """
    WITH new AS (
        INSERT INTO observers (id, name, kind, args, pool, retry, isolation, memory_limit_mb, status,
                               start_at, stop_at, run_for_s)
        SELECT id, name, kind, args, pool, retry, isolation, memory_limit_mb, status, start_at,
               coalesce(stop_at, CASE WHEN status = 'Created' THEN now() + run_for_s * interval '1 second' END),
               run_for_s
        FROM unnest(
            CAST(:ids AS uuid[]), CAST(:names AS text[]), CAST(:kinds AS text[]), CAST(:args AS jsonb[]),
            CAST(:pools AS text[]), CAST(:retries AS jsonb[]), CAST(:isolations AS text[]),
            CAST(:memory_limits AS float8[]), CAST(:statuses AS observer_status[]),
            CAST(:start_ats AS timestamptz[]), CAST(:stop_ats AS timestamptz[]), CAST(:run_fors AS float8[])
        ) AS v(id, name, kind, args, pool, retry, isolation, memory_limit_mb, status, start_at, stop_at, run_for_s)
        RETURNING id, status, created_at
    ), pending AS (
        -- A Scheduled row gets its pending start when it is due (manager/db/schedule.py).
        INSERT INTO pending_starts (observer_id, created_at) SELECT id, created_at FROM new WHERE status = 'Created'
    ), history AS (
        INSERT INTO observer_events (observer_id, at, event) SELECT id, created_at, :created_event FROM new
    )
    SELECT now()
    """
)


@dataclass(frozen=True, slots=True)
class NewSchedule:
    """When a new row starts (None: now) and stops (``stop_at``, or ``run_for_s`` after its start)."""

    start_at: datetime | None = None
    stop_at: datetime | None = None
    run_for_s: float | None = None


async def insert_created(
    session: AsyncSession, starts: Sequence[StartObserver], schedules: Sequence[NewSchedule] | None = None
) -> datetime:
    """The rows of ``starts`` (Created, or Scheduled where ``schedules`` says a start_at),
    the pending starts of the Created ones and their "created" events, in one round trip;
    returns their ``created_at``. A taken name raises ``IntegrityError``."""
    plans = schedules or [NewSchedule()] * len(starts)
    params = {
        "ids": [s.observer_id for s in starts],
        "names": [s.name for s in starts],
        "kinds": [s.kind for s in starts],
        "args": [pydantic_core.to_json(s.args).decode() for s in starts],
        "pools": [s.pool for s in starts],
        "retries": [s.retry.model_dump_json() for s in starts],
        "isolations": [s.isolation for s in starts],
        "memory_limits": [s.memory_limit_mb for s in starts],
        "statuses": [(S.CREATED if p.start_at is None else S.SCHEDULED).value for p in plans],
        "start_ats": [p.start_at for p in plans],
        "stop_ats": [p.stop_at for p in plans],
        "run_fors": [p.run_for_s for p in plans],
        "created_event": EventType.CREATED.value,
    }
    created_at: datetime = (await session.execute(_INSERT_CREATED, params)).scalar_one()
    return created_at
