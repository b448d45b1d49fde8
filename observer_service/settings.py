"""An observer service's settings (``ORCH_*``; docs/configuration.md is made from the
fields' descriptions): ``get_service_settings()`` builds them once per process."""

from __future__ import annotations

import re
import socket
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import NoDecode

from shared.egress import DEFAULT_DENY, DENY_ENV, Network, parse_networks
from shared.kinds.periodic import parse_modules
from shared.settings import CommonSettings, split_commas

AUTO = 0
AUTO_SLOTS = -1

_POOL_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


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
        "cut off from the others, which then hand its starts on); it must stay under 0.75 x the broker's "
        "`net_ticktime` + 2 s less 1.25 s, and is lowered to that where the broker's net_ticktime can be read "
        '(`ORCH_BROKER_METRICS_URLS`; docs/design.md, "How soon the starts of a dead node may move")',
    )
    broker_metrics_urls: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="with `ORCH_QUEUE_TYPE=quorum`: RabbitMQ's Prometheus endpoints (comma-separated), where the "
        "service reads each node's `net_ticktime` to check `ORCH_LEASE_GIVE_UP_S` against it (lowered to fit if "
        "needed) and to say when a node cut off would wait long; `none`: not read",
        json_schema_extra={
            "shown_default": "`http://HOST:15692/metrics` for each broker URL's host (`https://HOST:15691/metrics` "
            "for an `amqps://` one, verified with `ORCH_AMQP_CA_FILE` and `ORCH_AMQP_CERT_FILE`)"
        },
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

    @field_validator("broker_metrics_urls", mode="before")
    @classmethod
    def _split_metrics_urls(cls, value: object) -> object:
        return split_commas(value)

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


@lru_cache(maxsize=1)
def get_service_settings() -> ServiceSettings:
    return ServiceSettings()
