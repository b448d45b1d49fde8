"""API request and response bodies (apart from the ORM models)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, cast

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from manager import schedule
from manager.api.limits import MAX_ARGS_BYTES
from manager.create_result import CreatedObserver
from manager.db.models import Observer, ObserverEvent, ObserverStatus, Service, ServiceStatus
from shared.messages import Isolation, RetryPolicy

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$"
POOL_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


class RetryOverride(BaseModel):
    """Any subset of the retry policy; what is left out comes from the settings."""

    model_config = ConfigDict(extra="forbid")

    max_attempts: int | None = Field(default=None, ge=1, le=1_000_000, description="null = retry forever")
    initial_delay_s: float | None = Field(default=None, ge=0, le=3600)
    factor: float | None = Field(default=None, ge=1, le=100)
    max_delay_s: float | None = Field(default=None, ge=0, le=86_400)
    jitter: float | None = Field(default=None, ge=0, le=1)
    reset_after_s: float | None = Field(default=None, ge=0, le=86_400 * 30)


class ObserverCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="unique among observers not Deleted/Failed")
    kind: str = Field(min_length=1, max_length=100)
    args: dict[str, Any] = Field(default_factory=dict, description=f"at most {MAX_ARGS_BYTES} bytes as JSON")
    pool: str = Field(default="default", pattern=POOL_PATTERN)
    retry: RetryOverride | None = Field(
        default=None, description="fields to change in the default retry policy (ORCH_RETRY_* settings)"
    )
    isolation: Isolation | None = Field(default=None, description="default: the kind's own isolation")
    memory_limit_mb: float | None = Field(
        default=None, gt=0, le=1_048_576, description="isolation 'process' only: kill and restart above this RSS"
    )
    rebalance: bool | None = Field(
        default=None,
        description="false: never moved to even the load (pinned); draining its service still moves it. "
        "Default: the kind's own (true unless the kind pins its observers)",
    )
    start_at: datetime | None = Field(
        default=None,
        description="RFC 3339 with an offset: Scheduled until then, then started (a past time starts now)",
    )
    stop_at: datetime | None = Field(default=None, description="RFC 3339 with an offset: stopped then (`expired`)")
    run_for_s: float | None = Field(
        default=None, gt=0, le=86_400 * 366, description="stopped this long after it starts; not with stop_at"
    )

    @field_validator("start_at", "stop_at")
    @classmethod
    def _with_offset(cls, value: datetime | None, info: Any) -> datetime | None:
        return schedule.aware(value, info.field_name)

    @model_validator(mode="after")
    def _schedule(self) -> ObserverCreate:
        found = schedule.problems(self.start_at, self.stop_at, self.run_for_s, datetime.now(UTC))
        if found:
            raise ValueError("; ".join(found))
        return self

    @field_validator("args")
    @classmethod
    def _args_size(cls, args: dict[str, Any]) -> dict[str, Any]:
        size = len(pydantic_core.to_json(args))  # compact JSON; json.dumps was most of a bulk create's validation
        if size > MAX_ARGS_BYTES:
            raise ValueError(f"args are {size} bytes as JSON; the limit is {MAX_ARGS_BYTES}")
        return args

    def retry_fields(self) -> dict[str, Any] | None:
        return None if self.retry is None else self.retry.model_dump(exclude_unset=True)


class Probation(BaseModel):
    """Its services died too often while it ran: it runs in a child process of its own until it
    has run cleanly there for its retry policy's ``reset_after_s``."""

    since: datetime
    # When its current clean run in a child began; None: not isolated yet (waiting for its
    # service to move it into a child process, or for a free process slot).
    isolated_since: datetime | None


AWAITING_BROKER = (
    "waits for the broker to hand its start on: the broker session of the service that ran it ended (a node "
    "died or was cut off), and its queue holds the start for that session until it lets the session go"
)


def _paused(obs: Observer | CreatedObserver) -> str | None:
    if obs.status == ObserverStatus.CREATED and obs.service_id is None and obs.awaiting_broker_since is not None:
        return f"{AWAITING_BROKER} (since {obs.awaiting_broker_since.isoformat()})"
    if obs.status != ObserverStatus.PROCESSING or obs.probation_since is None or obs.probation_clean_since:
        return None
    return "on probation: waits for a free process slot on its service to run in a child process"


class ObserverOut(BaseModel):
    id: uuid.UUID
    name: str
    kind: str
    args: dict[str, Any]
    pool: str
    status: ObserverStatus
    service_id: uuid.UUID | None
    service_name: str | None
    attempts: int = Field(
        description="its first start plus each retry after its own failure; a move to another service is not one"
    )
    last_error: str | None
    retry: RetryPolicy | None
    isolation: Isolation | None
    memory_limit_mb: float | None
    probation: Probation | None = None
    paused: str | None = Field(
        default=None,
        description="why it is not running now: Processing on probation, it waits for its service to move it "
        "into a child process, which takes a free process slot (its delivery stays held); Created on no service, "
        "its start waits for the broker to hand it on, because the broker session of the service that ran it ended",
    )
    start_at: datetime | None = Field(default=None, description="when a Scheduled observer starts")
    stop_at: datetime | None = Field(default=None, description="when it is stopped (`expired`)")
    run_for_s: float | None = Field(default=None, description="how long it runs once started (sets stop_at then)")
    rebalance: bool = Field(default=True, description="false: pinned, never moved to even the load")
    created_at: datetime
    modified_at: datetime

    @classmethod
    def of(cls, obs: Observer | CreatedObserver, service_name: str | None = None) -> ObserverOut:
        # Not validated again: every field comes from a row (or a create) that was. Lists of
        # up to 1,000 observers spent more time here than in the database.
        return cls.model_construct(
            id=obs.id,
            name=obs.name,
            kind=obs.kind,
            args=obs.args,
            pool=obs.pool,
            status=obs.status,
            service_id=obs.service_id,
            service_name=service_name,
            attempts=obs.attempts,
            last_error=obs.last_error,
            retry=_retry_policy(obs.retry),
            isolation=cast("Isolation | None", obs.isolation),  # validated on create; quoted: a union is built per call
            memory_limit_mb=obs.memory_limit_mb,
            probation=None
            if obs.probation_since is None
            else Probation.model_construct(since=obs.probation_since, isolated_since=obs.probation_clean_since),
            paused=_paused(obs),
            start_at=obs.start_at,
            stop_at=obs.stop_at,
            run_for_s=obs.run_for_s,
            rebalance=not obs.pinned,
            created_at=obs.created_at,
            modified_at=obs.modified_at,
        )


def _retry_policy(retry: dict[str, Any] | RetryPolicy | None) -> RetryPolicy | None:
    if retry is None or isinstance(retry, RetryPolicy):
        return retry
    return _stored_policy(tuple(retry.items()))


# Rows share a few policies: one model per distinct stored policy, not one per row (building
# one per row was a noticeable share of a list page's CPU: docs/bench-history.md, "2026-11-27,
# fifth session"). RetryPolicy is frozen, so sharing is safe.
@lru_cache(maxsize=1024)
def _stored_policy(items: tuple[tuple[str, Any], ...]) -> RetryPolicy:
    return RetryPolicy.model_construct(**dict(items))


class BulkCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    observers: list[ObserverCreate] = Field(min_length=1, max_length=1000)


class ObserverList(BaseModel):
    items: list[ObserverOut]


class BulkStop(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[uuid.UUID] = Field(min_length=1, max_length=10_000)


class BulkStopResult(BaseModel):
    stopping: list[uuid.UUID] = Field(description="now (or already) OnDeleting")
    final: list[uuid.UUID] = Field(description="already Deleted or Failed: nothing to stop")
    unknown: list[uuid.UUID]
    cancelled: list[uuid.UUID] = Field(default_factory=list, description="were Scheduled: now Deleted, never started")


class Reschedule(BaseModel):
    """A Scheduled observer's new start time."""

    model_config = ConfigDict(extra="forbid")

    start_at: datetime = Field(description="RFC 3339 with an offset; a past time starts it at once")

    @field_validator("start_at")
    @classmethod
    def _with_offset(cls, value: datetime) -> datetime:
        checked = schedule.aware(value, "start_at")
        assert checked is not None
        return checked


class ObserverPage(BaseModel):
    items: list[ObserverOut]
    next_cursor: str | None


class ServiceOut(BaseModel):
    id: uuid.UUID
    name: str
    status: ServiceStatus
    host: str
    pid: int | None
    version: str
    pools: list[str]
    kinds: list[str]
    workers_count: int
    process_slots: int
    running: int
    loop_lag_ms: float
    # What the broker refuses this service for good (a pool's start queue it cannot consume,
    # and what to change); null: nothing. An alive service with this set is not well.
    refused: str | None = None
    # Being drained (``POST /api/services/{id}/drain``): it takes no new starts and hands its
    # observers over; ``drain_note`` says how far ("drained", or what it waits for).
    draining: bool = False
    drain_note: str | None = None
    heartbeat_age_s: float
    last_heartbeat_at: datetime
    created_at: datetime
    modified_at: datetime

    @classmethod
    def of(cls, svc: Service, running: int) -> ServiceOut:
        return cls(
            id=svc.id,
            name=svc.name,
            status=svc.status,
            host=svc.host,
            pid=svc.pid,
            version=svc.version,
            pools=svc.pools,
            kinds=svc.kinds,
            workers_count=svc.workers_count,
            process_slots=svc.process_slots,
            running=running,
            loop_lag_ms=svc.loop_lag_ms,
            refused=svc.refused,
            draining=svc.draining,
            drain_note=svc.drain_note,
            heartbeat_age_s=round((datetime.now(UTC) - svc.last_heartbeat_at).total_seconds(), 3),
            last_heartbeat_at=svc.last_heartbeat_at,
            created_at=svc.created_at,
            modified_at=svc.modified_at,
        )


class Capacity(BaseModel):
    total: int
    used: int
    free: int


class Stats(BaseModel):
    observers: dict[str, int] = Field(description="observers per status")
    services: dict[str, int] = Field(description="services per state")
    capacity: dict[str, Capacity] = Field(description="per pool")
    kinds: dict[str, dict[str, int]] = Field(description="observers per kind, then per status")
    probation: int = Field(default=0, description="live observers on probation (run in a child process)")
    paused: int = Field(
        default=0, description="of those, Processing but paused until their service has a free process slot"
    )
    awaiting_broker: int = Field(
        default=0,
        description="observers Created on no service whose start waits for the broker to hand it on: the broker "
        "session of the service that ran them ended (a node died or was cut off)",
    )
    state_applied_by: str | None = Field(
        default=None,
        description="the manager that applies state reports and runs the repairs (the leader, by "
        "`ORCH_MANAGER_NAME`); null while none does",
    )
    imbalance: float = Field(
        default=0.0,
        description="the largest deviation of an alive service's observers from its fair share (by capacity) of "
        "its pool, as a fraction of that share: 0 is even; the balancer acts beyond ORCH_BALANCE_TOLERANCE",
    )


class EventOut(BaseModel):
    id: int
    at: datetime
    event: str
    service_id: uuid.UUID | None
    from_service_id: uuid.UUID | None
    detail: str | None

    @classmethod
    def of(cls, e: ObserverEvent) -> EventOut:
        return cls(
            id=e.id,
            at=e.at,
            event=e.event,
            service_id=e.service_id,
            from_service_id=e.from_service_id,
            detail=e.detail,
        )


class KindOut(BaseModel):
    name: str
    description: str
    isolation: Isolation
    rebalance: bool = Field(description="false: the kind pins its observers unless a create says otherwise")
    args_schema: dict[str, Any]
    builtin: bool
    pools: list[str] = Field(description="pools with a live service offering this kind")
    services: int = Field(description="live services offering this kind")


class ErrorOut(BaseModel):
    detail: str = Field(description="what went wrong and what to do about it")


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in {
        400: "the request body is not valid JSON",
        401: "no token, or an unknown one (when ORCH_API_TOKENS is set)",
        403: "a read-only token tried to change something",
        404: "no such observer or service",
        409: "conflicts with the current state (name in use, already final, not Failed, not Scheduled)",
        413: "request body over ORCH_MAX_BODY_BYTES",
        422: "invalid request: the detail names every field to fix",
        503: "no capacity, no live service in the pool, or the broker/database is unreachable "
        "(with a Retry-After header)",
    }.items()
}
