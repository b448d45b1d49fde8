"""The settings every process shares, from environment variables prefixed ``ORCH_``
(docs/configuration.md, made from the fields' descriptions), and how a process loads its own:
the manager's are ``manager.settings``, an observer service's ``observer_service.settings``.

Each process builds its settings once through a cached getter; tests start real
processes with their own environment instead of patching these objects.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from typing import Annotated, Literal, Self, TypeVar
from urllib.parse import quote

from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.event_loop import EventLoopChoice

T = TypeVar("T")


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


def split_commas(value: object) -> object:
    """A comma-separated setting as its list of non-empty items (a list stays as it is)."""
    return [item.strip() for item in value.split(",") if item.strip()] if isinstance(value, str) else value


class CommonSettings(BaseSettings):
    """Every field's ``description`` is its documentation: ``docs/configuration.md`` is made
    from them (``python -m tools.settings_doc``), and a test fails when the two differ."""

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
        return split_commas(value)

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


def amqp_url_with_heartbeat(url: str, heartbeat_s: int) -> str:
    """Add ``heartbeat=`` to an AMQP URL unless it has one: aiormq uses the URL value
    (default 60 s) and ignores the server's proposal."""
    if "heartbeat=" in url:
        return url
    return f"{url}{'&' if '?' in url else '?'}heartbeat={heartbeat_s}"


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
