"""What the manager's API answers, as typed, frozen dataclasses written by hand.

Written rather than generated: the client must install with the base dependencies (httpx
only, no pydantic), and a hand-written model reads better in an editor. They are kept true by
``tests/system/test_client.py``, which diffs every model's fields against a live manager's
``/openapi.json``. A field the manager adds later is ignored until a model names it, so an
older client keeps working against a newer manager.
"""

from __future__ import annotations

import dataclasses
import types
import typing
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a service restarts an observer whose body returned or raised; ``None`` attempts:
    for ever. The defaults are the API's."""

    max_attempts: int | None = 5
    initial_delay_s: float = 1.0
    factor: float = 2.0
    max_delay_s: float = 60.0
    jitter: float = 0.1
    reset_after_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Probation:
    """Its services died too often while it ran: it runs in a child process of its own."""

    since: datetime
    isolated_since: datetime | None


@dataclass(frozen=True, slots=True)
class Observer:
    id: uuid.UUID
    name: str
    kind: str
    args: dict[str, Any]
    pool: str
    status: str  # Scheduled, Created, Processing, OnDeleting, Deleted, Failed
    service_id: uuid.UUID | None
    service_name: str | None
    attempts: int
    last_error: str | None
    retry: RetryPolicy | None
    isolation: str | None
    memory_limit_mb: float | None
    created_at: datetime
    modified_at: datetime
    probation: Probation | None = None
    paused: str | None = None
    start_at: datetime | None = None
    stop_at: datetime | None = None
    run_for_s: float | None = None
    rebalance: bool = True

    @property
    def final(self) -> bool:
        """Deleted or Failed: nothing will change it but a restart (of a Failed one)."""
        return self.status in ("Deleted", "Failed")


@dataclass(frozen=True, slots=True)
class BulkStopResult:
    stopping: list[uuid.UUID]
    final: list[uuid.UUID]
    unknown: list[uuid.UUID]
    cancelled: list[uuid.UUID] = dataclasses.field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Service:
    id: uuid.UUID
    name: str
    status: str  # alive, lost, dead
    host: str
    pid: int | None
    version: str
    pools: list[str]
    kinds: list[str]
    workers_count: int
    process_slots: int
    running: int
    loop_lag_ms: float
    heartbeat_age_s: float
    last_heartbeat_at: datetime
    created_at: datetime
    modified_at: datetime
    refused: str | None = None
    draining: bool = False
    drain_note: str | None = None


@dataclass(frozen=True, slots=True)
class Capacity:
    total: int
    used: int
    free: int


@dataclass(frozen=True, slots=True)
class Stats:
    observers: dict[str, int]
    services: dict[str, int]
    capacity: dict[str, Capacity]
    kinds: dict[str, dict[str, int]]
    probation: int = 0
    paused: int = 0
    awaiting_broker: int = 0
    state_applied_by: str | None = None
    imbalance: float = 0.0


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    at: datetime
    event: str
    service_id: uuid.UUID | None
    from_service_id: uuid.UUID | None
    detail: str | None


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    description: str
    isolation: str
    rebalance: bool
    args_schema: dict[str, Any]
    builtin: bool
    pools: list[str]
    services: int


@dataclass(frozen=True, slots=True)
class ServiceLoadSeries:
    id: str
    name: str
    running: list[int | None]
    workers: list[int | None]


@dataclass(frozen=True, slots=True)
class PerMinute:
    at: list[float]
    created: list[int]
    stopped: list[int]
    failed: list[int]
    failovers: list[int]


@dataclass(frozen=True, slots=True)
class History:
    """The last hour as the answering manager sampled it."""

    period_s: float
    window_s: float
    at: list[float]
    observers: dict[str, list[int]]
    services: list[ServiceLoadSeries]
    per_minute: PerMinute


# The API's schema name of each model (tests/system/test_client.py diffs them).
SCHEMA_NAMES: dict[type, str] = {
    RetryPolicy: "RetryPolicy",
    Probation: "Probation",
    Observer: "ObserverOut",
    BulkStopResult: "BulkStopResult",
    Service: "ServiceOut",
    Capacity: "Capacity",
    Stats: "Stats",
    Event: "EventOut",
    Kind: "KindOut",
    ServiceLoadSeries: "ServiceLoadSeries",
    PerMinute: "PerMinute",
    History: "HistoryOut",
}


def to_json(value: Any) -> Any:
    """A model (or a list or dict of them) as the API's JSON would decode: ids and times as
    strings, nested models as objects."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def parse(cls: type[T], data: Any) -> T:
    """``data`` (a decoded JSON object) as ``cls``: ids and times parsed, nested models built,
    keys the model does not name ignored."""
    hints = _hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{key: _convert(hints[key], value) for key, value in data.items() if key in known})


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _convert(inner[0], value) if len(inner) == 1 else value
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_convert(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(hint)
        return {k: _convert(item, v) for k, v in value.items()}
    if hint is uuid.UUID:
        return uuid.UUID(value)
    if hint is datetime:
        return datetime.fromisoformat(value)
    if dataclasses.is_dataclass(hint):
        return parse(hint, value)  # type: ignore[arg-type]
    return value
