"""The manager's settings (``ORCH_*``; docs/configuration.md is made from the fields'
descriptions): ``get_manager_settings()`` builds them once per process (API and state side)."""

from __future__ import annotations

import socket
import ssl
from functools import lru_cache
from typing import Annotated, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from shared.messages import RetryPolicy
from shared.settings import CommonSettings, TlsFile
from shared.tls import client_context

MAX_START_QUEUES = 64  # start queues per pool at most (``ORCH_START_QUEUES``)


class ManagerSettings(CommonSettings):
    database_url: str = Field(
        default="postgresql+asyncpg://orch:orch@127.0.0.1:5442/orch",
        description="PostgreSQL URL (the manager's, and alembic's)",
    )
    database_tls: bool = Field(
        default=False,
        description="connect to PostgreSQL over TLS, verifying its certificate and host name (against "
        "`ORCH_DATABASE_CA_FILE`, else the system's trust store); on when a CA file is set",
    )
    database_ca_file: TlsFile = Field(
        default=None,
        description="the CA certificates (PEM) PostgreSQL's certificate is verified against",
        json_schema_extra={"shown_default": "unset"},
    )
    database_cert_file: TlsFile = Field(
        default=None,
        description="this client's certificate (PEM), for a server that asks for one (`clientcert` in pg_hba.conf)",
        json_schema_extra={"shown_default": "unset"},
    )
    database_key_file: TlsFile = Field(
        default=None,
        description="the private key of `ORCH_DATABASE_CERT_FILE` (PEM); unset: the key is in that file",
        json_schema_extra={"shown_default": "unset"},
    )
    manager_host: str = Field(default="127.0.0.1", description="the address the API listens on")
    manager_port: int = Field(default=8000, ge=0, le=65535, description="the port the API listens on")
    manager_tls_cert_file: TlsFile = Field(
        default=None,
        description="serve the API over HTTPS with this certificate chain (PEM); unset: plain HTTP",
        json_schema_extra={"shown_default": "unset"},
    )
    manager_tls_key_file: TlsFile = Field(
        default=None,
        description="the private key of `ORCH_MANAGER_TLS_CERT_FILE` (PEM); unset: the key is in that file",
        json_schema_extra={"shown_default": "unset"},
    )
    manager_name: str = Field(
        default="",
        max_length=63,
        description="this manager's name in `/api/stats` (`state_applied_by`) and in PostgreSQL's "
        "`pg_stat_activity`; empty: the host's name and `ORCH_MANAGER_PORT`",
        json_schema_extra={"shown_default": "the host's name:port"},
    )
    leader_timeout_s: float = Field(
        default=10.0,
        ge=2.0,
        description="of several managers, the one applying state reports and running the repairs (the leader) "
        "gives way when PostgreSQL has not heard from it this long (frozen, cut off); a leader that exits gives "
        "way at once",
    )
    lost_after_heartbeats: int = Field(
        default=3,
        ge=1,
        description="missed heartbeats before the manager asks the broker whether the service's connection lives; "
        "only a gone connection marks it lost",
    )
    api_in_flight: int = Field(
        default=20_000,
        ge=1,
        description="observers the API creates or stops at once (all requests together); a request past it gets "
        "503 with `Retry-After` (one larger request alone is let through)",
    )
    start_queues: int = Field(
        default=1,
        ge=1,
        le=MAX_START_QUEUES,
        description="start queues per pool, so that its creates, redeliveries and acks run on several "
        "(on a cluster, their leaders on different nodes); an observer's starts always go to the same one, and "
        "the services consume them all; lowered later, the queues past it stay consumed until their starts are moved "
        "into the first ones (within ORCH_BALANCE_MOVES_PER_S), then are deleted, so nothing is lost "
        '(docs/design.md, "A pool over several start queues")',
    )
    start_queue_delete_after_s: float = Field(
        default=300.0,
        ge=0,
        description="a start queue past ORCH_START_QUEUES (lowered) is deleted once it has been empty and "
        "consumed by no service this long: a manager not restarted with the new setting yet still publishes to it",
    )
    restop_after_s: float = Field(
        default=10.0, gt=0, description="a stop still OnDeleting after this is broadcast again"
    )
    # Covers a create whose commit is still in flight.
    unknown_grace_s: float = Field(
        default=10.0,
        ge=0,
        description="an observer running with no row is adopted (or stopped, if its name is taken) after this",
    )
    pending_start_after_s: float = Field(
        default=30.0, gt=0, description="a row whose start was never confirmed is published again after this"
    )
    lost_start_after_s: float = Field(
        default=60.0,
        gt=0,
        description="a row with no service whose pool's queue stayed empty this long gets its start published again "
        "(doubling per attempt)",
    )
    services_retention_s: float = Field(
        default=3600.0,
        gt=0,
        description="a service stopped, replaced or lost this long ago is forgotten (its row deleted): pods that "
        "restart under new names do not grow `GET /api/services` without bound",
    )
    events_retention_days: float = Field(
        default=30.0,
        ge=0,
        description="history (`observer_events`) older than this is deleted in batches (`0` keeps it for ever)",
    )
    schedule_max_ahead_days: float = Field(
        default=366.0,
        gt=0,
        description="a start_at further ahead than this is refused (422): a Scheduled observer holds a worker "
        "of its pool from its create",
    )
    repair_interval_s: float = Field(default=1.0, gt=0, description="period of the background repairs")
    balance_tolerance: float = Field(
        default=0.1,
        ge=0,
        description="a service more than this fraction above or below its fair share (by capacity) of its pool "
        'gets observers handed to or from it (docs/design.md, "Even load")',
    )
    balance_moves_per_s: float = Field(
        default=250.0,
        ge=0,
        description="observers handed over per second at most, to even the load or drain (0: never)",
    )
    state_prefetch: int = Field(default=2000, ge=1, le=65535, description="state messages in flight to the manager")
    start_queue_keep_awake_from: int = Field(
        default=100_000,
        ge=0,
        description="a pool's start queue with this many live observers is kept from hibernating (0: never; "
        "`manager/queue_waker.py`)",
    )
    start_queue_keep_awake_s: float = Field(
        default=0.5, gt=0, description="how often such a queue is passive-declared to keep it awake"
    )
    start_queue_keep_awake_read_s: float = Field(
        default=30.0, gt=0, description="how often the live observers per pool are counted to choose those queues"
    )
    # Two cores, and a flood of reports never stalls a request.
    state_process: bool = Field(
        default=True,
        description="apply state and run the repairs in a child process of the API's (`false`: one process)",
    )
    api_tokens: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="bearer tokens (comma-separated) with full access; with neither this nor the next set, the API "
        "is open",
    )
    api_read_tokens: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="bearer tokens (comma-separated) that may only read",
    )
    api_db_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="how long an API request waits on PostgreSQL: a read (list, get, stats, metrics) that runs "
        "longer, or a create or stop that waits longer for a lock, is cancelled and answered 503 with `Retry-After` "
        "(writes only with the state side in its own process, the default); a database that answers nothing at all "
        "(cut off, frozen) is given up 5 s later by the API's own clock, connecting included",
    )
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, description="larger request bodies get 413")
    history_sample_s: float = Field(
        default=5.0,
        ge=0.5,
        le=60.0,
        description="the dashboard's charts: every this long the API samples the counts, the alive services and "
        "the failovers into a ring of the last hour kept in memory (`GET /api/history`)",
    )
    # The default retry policy of new observers (a create request may override any field).
    retry_max_attempts: int = Field(
        default=5, ge=0, description="default retry policy: runs in a row before Failed (`0` = forever)"
    )
    retry_initial_delay_s: float = Field(default=1.0, ge=0, description="default retry policy: the first delay")
    retry_factor: float = Field(
        default=2.0, ge=1, description="default retry policy: each delay is the one before times this"
    )
    retry_max_delay_s: float = Field(default=60.0, ge=0, description="default retry policy: the longest delay")
    retry_jitter: float = Field(
        default=0.1, ge=0, le=1, description="default retry policy: the share of each delay drawn at random"
    )
    retry_reset_after_s: float = Field(
        default=60.0, ge=0, description="default retry policy: a run this long starts the count again"
    )
    # manager/state/probation.py. A service's death is never enough to fail an observer. The
    # variable's HOST_DEATHS is an older name for the deaths of services, kept for compatibility.
    probation_after_host_deaths: int = Field(
        default=3,
        ge=0,
        description="deaths of its services (the name's `HOST` is an older word for service) within "
        "`ORCH_PROBATION_WINDOW_S` while it ran that put an observer on probation (a child process of its own "
        "until it has run cleanly for its policy's reset time; `0` = never)",
    )
    probation_window_s: float = Field(
        default=600.0,
        gt=0,
        description="the window of those service deaths",
    )
    probation_min_share: float = Field(
        default=0.75,
        ge=0,
        le=1,
        description="and the share of the service deaths it could have seen (in its pool, while it existed) that it "
        "must have seen: in an incident every observer sees some deaths, a service killer nearly all",
    )
    probation_budget: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="at most this share of the live observers on probation at once (at least one); a suspect past "
        "it, or whose service has no free process slot, waits for a next death",
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
    def name(self) -> str:
        """The manager's name (``manager_name``, or the host's name and the API's port)."""
        return self.manager_name or f"{socket.gethostname()}:{self.manager_port}"

    @property
    def silence_s(self) -> float:
        """How long a service may go unheard before the broker is asked whether it lives."""
        return self.heartbeat_s * self.lost_after_heartbeats

    @model_validator(mode="after")
    def _database_tls_consistent(self) -> Self:
        if self.database_cert_file and not (self.database_tls or self.database_ca_file):
            raise ValueError("ORCH_DATABASE_CERT_FILE is set but TLS is off: set ORCH_DATABASE_TLS=true")
        if self.manager_tls_key_file and not self.manager_tls_cert_file:
            raise ValueError(
                "ORCH_MANAGER_TLS_KEY_FILE is set without ORCH_MANAGER_TLS_CERT_FILE: set both, or neither"
            )
        if self.database_key_file and not self.database_cert_file:
            raise ValueError("ORCH_DATABASE_KEY_FILE is set without ORCH_DATABASE_CERT_FILE: set both, or neither")
        return self

    def database_tls_context(self) -> ssl.SSLContext | None:
        """The TLS context of every connection to PostgreSQL (API, state process, leader lock,
        Alembic), or None for plain text. asyncpg's ``sslmode=require`` would encrypt without
        verifying anything: this one verifies the certificate and the host name."""
        if not (self.database_tls or self.database_ca_file):
            return None
        return client_context(self.database_ca_file, self.database_cert_file, self.database_key_file)

    def default_retry(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.retry_max_attempts or None,
            initial_delay_s=self.retry_initial_delay_s,
            factor=self.retry_factor,
            max_delay_s=self.retry_max_delay_s,
            jitter=self.retry_jitter,
            reset_after_s=self.retry_reset_after_s,
        )


@lru_cache(maxsize=1)
def get_manager_settings() -> ManagerSettings:
    return ManagerSettings()
