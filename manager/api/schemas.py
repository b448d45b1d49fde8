"""API request and response bodies (apart from the ORM models)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from manager.db.models import Observer, ObserverStatus, Service, ServiceStatus

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$"
POOL_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


class ObserverCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, description="unique among observers not Deleted/Failed")
    kind: str = Field(min_length=1, max_length=100)
    args: dict[str, Any] = Field(default_factory=dict)
    pool: str = Field(default="default", pattern=POOL_PATTERN)


class ObserverOut(BaseModel):
    id: uuid.UUID
    name: str
    kind: str
    args: dict[str, Any]
    pool: str
    status: ObserverStatus
    service_id: uuid.UUID | None
    service_name: str | None
    attempts: int
    last_error: str | None
    created_at: datetime
    modified_at: datetime

    @classmethod
    def of(cls, obs: Observer, service_name: str | None = None) -> ObserverOut:
        return cls(
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
            created_at=obs.created_at,
            modified_at=obs.modified_at,
        )


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
    running: int
    loop_lag_ms: float
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
            running=running,
            loop_lag_ms=svc.loop_lag_ms,
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
    observers: dict[str, int]
    services: dict[str, int]
    capacity: dict[str, Capacity]
