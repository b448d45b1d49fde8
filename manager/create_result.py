"""An observer as a create inserted it: what the API answers a create with, built from the
start message and the schedule rather than read back (reading 1,000 rows back cost more than
inserting them)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from manager.db.creates import NewSchedule
from manager.db.models import ObserverStatus
from shared.messages import RetryPolicy, StartObserver


@dataclass(frozen=True, slots=True)
class CreatedObserver:
    """A row as ``create_many`` inserted it (the fields the API shows of an observer)."""

    id: uuid.UUID
    name: str
    kind: str
    args: dict[str, Any]
    pool: str
    retry: RetryPolicy
    isolation: str | None
    memory_limit_mb: float | None
    created_at: datetime
    status: ObserverStatus = ObserverStatus.CREATED
    start_at: datetime | None = None
    stop_at: datetime | None = None
    run_for_s: float | None = None
    service_id: uuid.UUID | None = None
    attempts: int = 0
    last_error: str | None = None
    probation_since: datetime | None = None
    probation_clean_since: datetime | None = None
    awaiting_broker_since: datetime | None = None
    pinned: bool = False

    @property
    def modified_at(self) -> datetime:
        return self.created_at


def created_row(start: StartObserver, plan: NewSchedule, created_at: datetime, pinned: bool) -> CreatedObserver:
    scheduled = plan.start_at is not None
    stop_at = plan.stop_at
    if stop_at is None and plan.run_for_s is not None and not scheduled:
        stop_at = created_at + timedelta(seconds=plan.run_for_s)  # as the insert computes it
    return CreatedObserver(
        start.observer_id,
        start.name,
        start.kind,
        start.args,
        start.pool,
        start.retry,
        start.isolation,
        start.memory_limit_mb,
        created_at,
        ObserverStatus.SCHEDULED if scheduled else ObserverStatus.CREATED,
        plan.start_at,
        stop_at,
        plan.run_for_s,
        pinned=pinned,
    )
