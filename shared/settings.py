"""Settings from environment variables prefixed ``ORCH_`` (see the README's table).

Each process builds its settings once through a cached getter; tests start real
processes with their own environment instead of patching these objects.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Callable
from functools import lru_cache
from typing import Annotated, Literal, TypeVar

from pydantic import AliasChoices, Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.egress import DEFAULT_DENY, DENY_ENV, Network, parse_networks
from shared.event_loop import EventLoopChoice
from shared.kinds.periodic import parse_modules
from shared.messages import RetryPolicy

AUTO = 0
AUTO_SLOTS = -1

T = TypeVar("T")

_POOL_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ORCH_", extra="ignore", populate_by_name=True)

    amqp_url: str = "amqp://orch:orch@127.0.0.1:5682/"
    # AMQP heartbeat H in seconds: how fast a silent peer is declared dead, and the base
    # of the fencing lease (valid for H/2 after the last confirmed round trip).
    amqp_heartbeat_s: int = Field(default=6, ge=2, le=60)
    # Service heartbeat to the manager (state queue), seconds.
    heartbeat_s: float = Field(default=5.0, gt=0)
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = "text"
    # "auto": uvloop when it is installed (a dependency on Linux), else asyncio's own loop.
    event_loop: EventLoopChoice = "auto"


class ServiceSettings(CommonSettings):
    service_name: str = Field(default_factory=socket.gethostname, min_length=1, max_length=200)
    # A number, or "auto" (AUTO = 0 here): sized from CPUs and memory at start
    # (observer_service.capacity, formula in the README).
    workers_count: int = Field(default=100, ge=AUTO, le=1_000_000)
    # How many observers may run in child processes (isolation "process"); "auto" (-1 here).
    process_slots: int = Field(default=AUTO_SLOTS, ge=AUTO_SLOTS, le=100_000)
    # Budgets of the "auto" formula.
    async_per_cpu: int = Field(default=5000, ge=1)
    async_budget_kb: float = Field(default=64.0, gt=0)
    processes_per_cpu: int = Field(default=8, ge=0)
    process_budget_mb: float = Field(default=64.0, gt=0)
    memory_fraction: float = Field(default=0.7, gt=0, le=1)
    pools: Annotated[list[str], NoDecode] = ["default"]
    inventory_s: float = Field(default=30.0, gt=0)
    # State reports awaiting the broker: past the high water no more starts are started until
    # the publisher catches up; past the maximum the oldest report is dropped (observer_service.outbox).
    outbox_high_water: int = Field(default=20_000, ge=1)
    outbox_max: int = Field(default=200_000, ge=1)
    # Observer events awaiting the broker's confirm at once; past it an emit waits for a slot
    # (backpressure on the observer; nothing is dropped).
    emits_in_flight: int = Field(default=1000, ge=1)
    stop_grace_s: float = Field(default=5.0, ge=0)
    # How long a stop for an observer this service does not host is remembered, so that a
    # start message arriving later (redistribution race) is acked at once instead of run.
    stopped_ids_ttl_s: float = Field(default=300.0, gt=0)
    # A process-isolated observer whose child shows no sign of life this long is killed and
    # restarted under its retry policy (a hung or CPU-bound-forever child). None: no check.
    process_liveness_timeout_s: float | None = Field(default=None, gt=0)
    # Where this service serves /metrics (0: nowhere).
    metrics_port: int = Field(default=0, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    # Modules (and packages) whose functions the `periodic` kind may call; empty: none, since
    # whoever may create observers picks the function. The kind reads the variable itself
    # (it also runs in child processes and tests); parsed here too so that a malformed list
    # stops the service at start.
    periodic_modules: Annotated[tuple[str, ...], NoDecode] = ()
    # Networks http_poll and websocket may (allow; empty: any) and may never (deny) connect
    # to, checked on the resolved addresses at connect time (shared.egress, which reads the
    # variables itself for the same reason as above). Deny unset = link-local + cloud metadata.
    egress_allow: Annotated[tuple[Network, ...], NoDecode] = ()
    egress_deny: Annotated[tuple[Network, ...], NoDecode] = parse_networks(DEFAULT_DENY, DENY_ENV)

    @field_validator("workers_count", mode="before")
    @classmethod
    def _auto_workers(cls, value: object) -> object:
        return AUTO if value == "auto" else value

    @field_validator("process_slots", mode="before")
    @classmethod
    def _auto_slots(cls, value: object) -> object:
        return AUTO_SLOTS if value == "auto" else value

    @field_validator("periodic_modules", mode="before")
    @classmethod
    def _split_modules(cls, value: object) -> object:
        return parse_modules(value) if isinstance(value, str) else value

    @field_validator("egress_allow", "egress_deny", mode="before")
    @classmethod
    def _split_networks(cls, value: object, info: ValidationInfo) -> object:
        return parse_networks(value, f"ORCH_{str(info.field_name).upper()}") if isinstance(value, str) else value

    @field_validator("pools", mode="before")
    @classmethod
    def _split_pools(cls, value: object) -> object:
        if isinstance(value, str):
            value = [p.strip() for p in value.split(",") if p.strip()]
        if isinstance(value, list):
            bad = [p for p in value if not isinstance(p, str) or not _POOL_RE.match(p)]
            if bad or not value:
                raise ValueError(f"pools must be a comma-separated list of names matching {_POOL_RE.pattern}")
        return value


class ManagerSettings(CommonSettings):
    database_url: str = "postgresql+asyncpg://orch:orch@127.0.0.1:5442/orch"
    manager_host: str = "127.0.0.1"
    manager_port: int = Field(default=8000, ge=0, le=65535)
    # A service silent for this many heartbeat intervals is asked about: the broker says
    # whether its connection lives (manager/liveness.py); only a gone one is marked lost.
    lost_after_heartbeats: int = Field(default=3, ge=1)
    # Observers the API creates or stops at once (all requests together); a request that
    # would go past it gets 503 with Retry-After (one larger request alone is let through).
    api_in_flight: int = Field(default=20_000, ge=1)
    # A stop still OnDeleting after this many seconds is broadcast again.
    restop_after_s: float = Field(default=10.0, gt=0)
    # An ObserverStarted for an id the manager does not know is stopped after this grace
    # (covers a create whose commit is still in flight).
    unknown_grace_s: float = Field(default=10.0, ge=0)
    # A row whose start message was never confirmed is published again after this age.
    enqueue_sweep_after_s: float = Field(default=30.0, gt=0)
    # A row with no host whose pool's start queue is empty for this long gets its start
    # published again (manager/lost_starts.py).
    lost_start_after_s: float = Field(default=60.0, gt=0)
    # History (observer_events) is kept this many days (0: for ever); manager/retention.py.
    events_retention_days: float = Field(default=30.0, ge=0)
    # Period of the background loops.
    sweep_interval_s: float = Field(default=1.0, gt=0)
    state_prefetch: int = Field(default=2000, ge=1, le=65535)
    # A pool's start queue holding at least this many messages is kept from hibernating by a
    # passive declare every start_queue_keep_awake_s (manager/queue_waker.py); 0: never.
    start_queue_keep_awake_from: int = Field(default=100_000, ge=0)
    start_queue_keep_awake_s: float = Field(default=0.5, gt=0)
    # Apply state and run the repairs in a child process of the API's (two cores, and a flood
    # of reports never stalls a request); false: everything in one process.
    state_process: bool = True
    # Bearer tokens for /api/* (comma-separated): full access, and read-only. None: open API.
    api_tokens: Annotated[list[str], NoDecode] = []
    api_read_tokens: Annotated[list[str], NoDecode] = []
    # How long an API request waits on PostgreSQL: a read (list, get, stats, metrics, the
    # dashboard) that runs longer, or a create or stop that waits longer for a lock, is
    # cancelled and answered 503 with Retry-After (a locked table, an overloaded database).
    api_db_timeout_s: float = Field(default=15.0, gt=0)
    # Request bodies above this many bytes are refused with 413.
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # Default retry policy of new observers (a create request may override any field).
    # 0 attempts = retry forever.
    retry_max_attempts: int = Field(default=5, ge=0)
    retry_initial_delay_s: float = Field(default=1.0, ge=0)
    retry_factor: float = Field(default=2.0, ge=1)
    retry_max_delay_s: float = Field(default=60.0, ge=0)
    retry_jitter: float = Field(default=0.1, ge=0, le=1)
    retry_reset_after_s: float = Field(default=60.0, ge=0)
    # Probation (manager/state/probation.py): an observer whose hosts died this many times
    # within the window while it ran is run in a child process of its own until it has run
    # cleanly for its retry policy's reset_after_s (0: off). A host death is never enough to
    # fail an observer. The old names ORCH_QUARANTINE_* are still read.
    probation_after_host_deaths: int = Field(
        default=3,
        ge=0,
        validation_alias=AliasChoices("ORCH_PROBATION_AFTER_HOST_DEATHS", "ORCH_QUARANTINE_AFTER_CRASHES"),
    )
    probation_window_s: float = Field(
        default=600.0,
        gt=0,
        validation_alias=AliasChoices("ORCH_PROBATION_WINDOW_S", "ORCH_QUARANTINE_WINDOW_S"),
    )

    @field_validator("api_tokens", "api_read_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: object) -> object:
        if isinstance(value, str):
            value = [t.strip() for t in value.split(",") if t.strip()]
        if isinstance(value, list) and any(len(t) < 8 for t in value):
            raise ValueError("API tokens must be at least 8 characters long")
        return value

    @property
    def silence_s(self) -> float:
        """How long a service may go unheard before the broker is asked whether it lives."""
        return self.heartbeat_s * self.lost_after_heartbeats

    def default_retry(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.retry_max_attempts or None,
            initial_delay_s=self.retry_initial_delay_s,
            factor=self.retry_factor,
            max_delay_s=self.retry_max_delay_s,
            jitter=self.retry_jitter,
            reset_after_s=self.retry_reset_after_s,
        )


def amqp_url_with_heartbeat(url: str, heartbeat_s: int) -> str:
    """Add ``heartbeat=`` to an AMQP URL unless it has one: aiormq uses the URL value
    (default 60 s) and ignores the server's proposal."""
    if "heartbeat=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}heartbeat={heartbeat_s}"


@lru_cache(maxsize=1)
def get_service_settings() -> ServiceSettings:
    return ServiceSettings()


@lru_cache(maxsize=1)
def get_manager_settings() -> ManagerSettings:
    return ManagerSettings()


_SECRET_PARTS = ("url", "token", "password")


def settings_or_exit(load: Callable[[], T]) -> T:
    """``load()`` the settings of a process starting; a value that does not validate is one
    line per setting on stderr (logging is configured from the settings, so not yet), naming
    the variable to fix, and exit status 2. Pydantic's error came with a traceback and the
    field's name (``workers_count``), not the variable's (``ORCH_WORKERS_COUNT``). Values of
    URLs and tokens are not echoed: they carry passwords."""
    try:
        return load()
    except ValidationError as e:
        for error in e.errors():
            field = str(error["loc"][0]) if error["loc"] else "?"
            variable = field.upper() if field.upper().startswith("ORCH_") else f"ORCH_{field.upper()}"
            shown = "" if any(part in field.lower() for part in _SECRET_PARTS) else f"={error.get('input')!r}"
            print(f"invalid setting {variable}{shown}: {error['msg']}", file=sys.stderr)
        raise SystemExit(2) from None


def hostname() -> str:
    return os.environ.get("HOSTNAME") or socket.gethostname()
