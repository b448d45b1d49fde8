"""Settings from environment variables prefixed ``ORCH_`` (docs/configuration.md, made from the
fields' descriptions here).

Each process builds its settings once through a cached getter; tests start real
processes with their own environment instead of patching these objects. Every setting of
every process is here, each beside its default and its description: that is why the module
is longer than the others.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import sys
from collections.abc import Callable
from functools import lru_cache
from typing import Annotated, Literal, Self, TypeVar
from urllib.parse import quote

from pydantic import AfterValidator, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.egress import DEFAULT_DENY, DENY_ENV, Network, parse_networks
from shared.event_loop import EventLoopChoice
from shared.kinds.periodic import parse_modules
from shared.messages import RetryPolicy
from shared.tls import client_context

AUTO = 0
AUTO_SLOTS = -1

T = TypeVar("T")

_POOL_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _readable(path: str | None) -> str | None:
    if path is not None:
        if not path:
            return None
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e.strerror}") from None
    return path


# A PEM file this process must be able to read (checked at start: a typo is a clear error
# then, not a handshake that fails later); empty means unset.
TlsFile = Annotated[str | None, AfterValidator(_readable)]


class CommonSettings(BaseSettings):
    """Every field's ``description`` is its documentation: ``docs/configuration.md`` is made
    from them (``python -m shared.settings_doc``), and a test fails when the two differ."""

    model_config = SettingsConfigDict(env_prefix="ORCH_", extra="ignore", populate_by_name=True)

    amqp_url: str = Field(default="amqp://orch:orch@127.0.0.1:5682/", description="RabbitMQ URL")
    amqp_urls: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="a cluster's node URLs, comma-separated, tried in this order (after a failure, the next one); "
        "replaces `ORCH_AMQP_URL`",
        json_schema_extra={"shown_default": "unset"},
    )
    amqp_heartbeat_s: int = Field(
        default=6,
        ge=2,
        le=60,
        description="AMQP heartbeat H: a silent peer is dead after ~H; the fencing lease lasts H/2",
    )
    heartbeat_s: float = Field(
        default=5.0, gt=0, description="service heartbeat period (the manager uses it to judge silence)"
    )
    # Several node URLs mean a cluster, where a classic queue dies with its node: never
    # classic there unless asked for (issue 65).
    queue_type: Literal["classic", "quorum"] = Field(
        default_factory=lambda data: "quorum" if len(data.get("amqp_urls") or []) > 1 else "classic",
        description="type of the durable queues: `quorum` on a RabbitMQ cluster (they survive a node, and the "
        "lease is confirmed by a majority), `classic` on one node; the manager and every service must agree",
        json_schema_extra={"shown_default": "`quorum` with several `ORCH_AMQP_URLS`, else `classic`"},
    )
    log_level: str = Field(default="INFO", description="log level")
    log_format: Literal["text", "json"] = Field(default="text", description="`json` for one JSON object per line")
    event_loop: EventLoopChoice = Field(
        default="auto", description="`uvloop` (installed on Linux; `auto` picks it) or `asyncio`"
    )

    amqp_ca_file: TlsFile = Field(
        default=None,
        description="with `amqps://` URLs: the CA certificates (PEM) the broker's certificate is verified "
        "against (its host name too); unset: the system's trust store",
        json_schema_extra={"shown_default": "unset"},
    )
    amqp_cert_file: TlsFile = Field(
        default=None,
        description="with `amqps://` URLs: this client's certificate (PEM), for a broker that asks for one "
        "(mutual TLS)",
        json_schema_extra={"shown_default": "unset"},
    )
    amqp_key_file: TlsFile = Field(
        default=None,
        description="the private key of `ORCH_AMQP_CERT_FILE` (PEM); unset: the key is in that file",
        json_schema_extra={"shown_default": "unset"},
    )

    @field_validator("amqp_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: object) -> object:
        return [url.strip() for url in value.split(",") if url.strip()] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _tls_needs_amqps(self) -> Self:
        if self.amqp_ca_file or self.amqp_cert_file or self.amqp_key_file:
            plain = [url for url in self.broker_urls() if not url.startswith("amqps://")]
            if plain:
                raise ValueError(
                    "ORCH_AMQP_CA_FILE/CERT_FILE/KEY_FILE are set, but a broker URL is not amqps:// "
                    "(ORCH_AMQP_URL or ORCH_AMQP_URLS): use amqps:// and the broker's TLS port (5671)"
                )
        if self.amqp_key_file and not self.amqp_cert_file:
            raise ValueError("ORCH_AMQP_KEY_FILE is set without ORCH_AMQP_CERT_FILE: set both, or neither")
        return self

    def broker_urls(self) -> list[str]:
        """The node URLs to connect to: ``amqp_urls``, or ``amqp_url`` alone; with the TLS
        files in each one's query, where aiormq reads them for every connection made to it
        (``cafile``, ``certfile``, ``keyfile``: verified, host name included)."""
        urls = list(self.amqp_urls) or [self.amqp_url]
        tls = {"cafile": self.amqp_ca_file, "certfile": self.amqp_cert_file, "keyfile": self.amqp_key_file}
        query = "&".join(f"{key}={quote(path, safe='/')}" for key, path in tls.items() if path)
        if not query:
            return urls
        return [f"{url}{'&' if '?' in url else '?'}{query}" for url in urls]


class ServiceSettings(CommonSettings):
    service_name: str = Field(
        default_factory=socket.gethostname,
        min_length=1,
        max_length=200,
        description="stable name; a new instance with the same name replaces the old one",
        json_schema_extra={"shown_default": "host name"},
    )
    amqp_home: Literal["by-name", "first"] = Field(
        default="by-name",
        description="the node of `ORCH_AMQP_URLS` this service connects to first and returns to (its home): "
        "`by-name`, the one a hash of `ORCH_SERVICE_NAME` picks, so that services given one list spread over "
        "the nodes; `first`, the first URL",
    )
    amqp_return_home_after_s: float = Field(
        default=60.0,
        ge=0,
        description="a service connected to another node than its home moves back once the home node has "
        "confirmed its writes for this long times a random 1 to 2 (services return one by one); moving hands "
        "its observers over, so each restarts once; 0: never",
    )
    # "auto" is AUTO (0) here: sized from CPUs and memory at start (observer_service.capacity).
    workers_count: int = Field(
        default=100,
        ge=AUTO,
        le=1_000_000,
        description="observers this service may run (its prefetch), or `auto` (from CPUs and memory)",
    )
    # "auto" is AUTO_SLOTS (-1) here.
    process_slots: int = Field(
        default=AUTO_SLOTS,
        ge=AUTO_SLOTS,
        le=100_000,
        description="how many of them may run as child processes (`isolation: process`), or `auto`",
        json_schema_extra={"shown_default": "`auto`"},
    )
    async_per_cpu: int = Field(default=5000, ge=1, description="`auto` workers: async observers per CPU")
    async_budget_kb: float = Field(default=64.0, gt=0, description="`auto` workers: memory budget per async observer")
    processes_per_cpu: int = Field(default=8, ge=0, description="`auto` process slots: child processes per CPU")
    process_budget_mb: float = Field(default=64.0, gt=0, description="`auto` process slots: memory per child process")
    memory_fraction: float = Field(
        default=0.7, gt=0, le=1, description="`auto`: the share of available memory the budgets may use"
    )
    pools: Annotated[list[str], NoDecode] = Field(
        default=["default"],
        description="comma-separated pools it serves",
        json_schema_extra={"shown_default": "`default`"},
    )
    inventory_s: float = Field(
        default=30.0, gt=0, description="period of the digest of what it runs, sent to the manager (anti-entropy)"
    )
    lease_give_up_s: float = Field(
        default=10.0,
        gt=0,
        description="with `ORCH_QUEUE_TYPE=quorum`: a lease unrenewed this long ends the session (its node may be "
        "cut off from the others, which then hand its starts on); keep it under 0.75 x the broker's "
        '`net_ticktime` + 2 s (docs/design.md, "How soon the starts of a dead node may move")',
    )
    refused_retry_s: float = Field(
        default=30.0,
        gt=0,
        description="a start queue the broker refuses to declare (other arguments, another type) is declared "
        "again this often, until the operator fixes it; said once a minute at most",
    )
    outbox_high_water: int = Field(
        default=20_000,
        ge=1,
        description="state reports awaiting the broker past which no more starts are started (they stay held) "
        "until the publisher catches up",
    )
    outbox_max: int = Field(
        default=200_000,
        ge=1,
        description="state reports kept at most; past it the oldest is dropped (counted in the log)",
    )
    emits_in_flight: int = Field(
        default=1000,
        ge=1,
        description="events awaiting the broker's confirm at once; past it `ctx.emit()` waits (nothing is dropped)",
    )
    stop_grace_s: float = Field(default=5.0, ge=0, description="how long a stopped observer may take to finish")
    # So that a start arriving after its stop (a redistribution race) is acked at once, not run.
    stopped_ids_ttl_s: float = Field(
        default=300.0, gt=0, description="how long a stop for an observer it does not run is remembered"
    )
    process_liveness_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="kill and restart (under its retry policy) a child process that shows no sign of life this long",
    )
    metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="where the service serves `/metrics`, `/healthz` and `/readyz` (0: nowhere); a port it cannot "
        "bind stops it at start with one line saying which (exit status 2)",
    )
    metrics_host: str = Field(
        default="127.0.0.1", description="the address `/metrics`, `/healthz` and `/readyz` listen on"
    )
    health_stall_s: float = Field(
        default=30.0,
        gt=0,
        description="`/healthz` fails (503) once the service's event loop has not run for this long (an observer "
        "that blocks it); the broker connection lives on its own thread meanwhile",
    )
    # The kind reads the variable itself (it also runs in child processes and tests); parsed
    # here too so that a malformed list stops the service at start.
    periodic_modules: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="comma-separated module or package names whose functions the `periodic` kind may call "
        "(`myjobs` allows `myjobs` and `myjobs.*`; the function must be defined there, not merely imported); "
        "unset or empty, `periodic` calls nothing and the manager answers such creates with a 422 naming this "
        "variable. Give every service of a pool the same list: a create must suit each of them",
        json_schema_extra={"shown_default": "unset (none)"},
    )
    # Checked on the resolved addresses at connect time by shared.egress, which reads the
    # variables itself for the same reason as above.
    egress_allow: Annotated[tuple[Network, ...], NoDecode] = Field(
        default=(),
        description="when set, the only networks `http_poll` and `websocket` may connect to; a denial wins over it",
        json_schema_extra={"shown_default": "unset (anywhere)"},
    )
    egress_deny: Annotated[tuple[Network, ...], NoDecode] = Field(
        default=parse_networks(DEFAULT_DENY, DENY_ENV),
        description="comma-separated networks (CIDR) or addresses `http_poll` and `websocket` never connect to; "
        "every address a URL's host resolves to is checked when connecting (a redirect too), and a refused one "
        "fails the observer with `EgressDenied` naming the network. The default refuses link-local addresses and "
        "cloud metadata services (instance credentials at 169.254.169.254); setting the variable replaces it "
        "(empty: nothing refused). Recommended lists: [the threat model](threat-model.md#what-operators-should-set)",
        json_schema_extra={"shown_default": f"`{DEFAULT_DENY}`"},
    )

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
    the variable to fix, and exit status 2, where pydantic's error is a traceback naming the
    field (``workers_count``), not the variable (``ORCH_WORKERS_COUNT``). Values of URLs and
    tokens are not echoed: they carry passwords."""
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
