"""The broker's ``net_ticktime``, read from its nodes, against what the lease's give-up bound
assumes of it (docs/design.md, "How soon the starts of a dead node may move").

On a cluster a session whose lease stayed unrenewed for G (``ORCH_LEASE_GIVE_UP_S``) ends, and
the majority hands a cut-off node's starts on 0.75 N + T after the cut at the earliest (N the
broker's ``net_ticktime``, T the queues' hand-on timeout). It is safe while G + P < 0.75 N + T
(P the lease's renewal period). N is a node setting that no queue or consumer argument
carries, so each service reads it from RabbitMQ's own Prometheus endpoint (the
``rabbitmq_prometheus`` plugin's ``rabbitmq_erlang_net_ticktime_seconds``, on 3.10, 4.0 and 4.3):
* a net_ticktime too short for G lowers G to fit, for the sessions that open from then on,
  so a node configured with a short one never makes the lease unsafe; said once;
* one longer than the 20 s the project ships is said with what it costs (a node cut off
  keeps its observers stopped for up to 1.25 N + T) and what to set;
* an endpoint that does not answer is said once: G is then assumed safe, not checked.
Read at start and every ``RECHECK_S`` (a minute while some node has not answered).
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from collections.abc import Sequence
from urllib.parse import urlsplit

import httpx

from observer_service import metrics
from shared import topology

logger = logging.getLogger(__name__)

# rabbitmq_prometheus's default ports: plain, and TLS where the node has a TLS listener for it
# (the Kubernetes operator's with TLS, where no plain listener is left).
PROMETHEUS_PORT = 15692
PROMETHEUS_TLS_PORT = 15691
METRIC = "rabbitmq_erlang_net_ticktime_seconds"
# What deploy/rabbitmq/cluster.conf sets: a cut noticed after 15 to 25 s.
SHIPPED_S = 20.0
# Room for a loaded event loop between the give-up's check and the session's end.
MARGIN_S = 1.0
RECHECK_S = 600.0
RETRY_S = 60.0
READ_TIMEOUT_S = 1.5
_LINE = re.compile(rf"^{METRIC}(?:\{{[^}}]*\}})?\s+(\S+)", re.MULTILINE)


def endpoint_urls(amqp_urls: Sequence[str], configured: Sequence[str]) -> list[str]:
    """Where to read it: ``ORCH_BROKER_METRICS_URLS`` (``none``: nowhere), else the Prometheus
    port of each broker URL's host: TLS for an ``amqps://`` one, verified as AMQP is."""
    if configured:
        return [] if [url.lower() for url in configured] == ["none"] else list(configured)
    found = []
    for url in amqp_urls:
        parts = urlsplit(url)
        host = parts.hostname or "localhost"
        host = f"[{host}]" if ":" in host else host
        tls = parts.scheme == "amqps"
        found.append(f"{'https' if tls else 'http'}://{host}:{PROMETHEUS_TLS_PORT if tls else PROMETHEUS_PORT}/metrics")
    return list(dict.fromkeys(found))


def parse(text: str) -> float:
    """The net_ticktime in a Prometheus text page; ValueError if it holds none."""
    found = _LINE.search(text)
    if found is None:
        raise ValueError(f"no {METRIC} in it: not RabbitMQ's endpoint?")
    return float(found.group(1))


def handed_on_after_s(ticktime_s: float) -> float:
    """The earliest the majority may hand a cut-off node's starts on, after the cut."""
    return 0.75 * ticktime_s + topology.HAND_ON_AFTER_MS / 1000


def safe_give_up(give_up_s: float, ticktime_s: float, renewal_s: float) -> float:
    """The largest give-up bound no greater than ``give_up_s`` that ends a cut-off session
    before the majority may hand its starts on."""
    return min(give_up_s, handed_on_after_s(ticktime_s) - renewal_s - MARGIN_S)


def cut_costs_s(ticktime_s: float) -> float:
    """How long a node cut off keeps its observers stopped at most, before the hand-on."""
    return 1.25 * ticktime_s + topology.HAND_ON_AFTER_MS / 1000


class NetTicktime:
    """The give-up bound the next session uses (``give_up_s``), from the configured one and
    every node's net_ticktime read so far."""

    def __init__(
        self, urls: Sequence[str], give_up_s: float, renewal_s: float, tls: ssl.SSLContext | None = None
    ) -> None:
        self.urls = list(urls)
        self._tls = tls  # verifies an https endpoint (the AMQP CA and client certificate)
        self.configured_s = give_up_s
        self.give_up_s = give_up_s
        self._renewal_s = renewal_s
        self._read: dict[str, float] = {}  # the last value each endpoint answered
        self._said: dict[str, str] = {}  # what was last said of each, so only changes are said
        metrics.LEASE_GIVE_UP.set(give_up_s)

    async def check(self) -> bool:
        """Read every endpoint once; True if each answered."""
        async with httpx.AsyncClient(timeout=READ_TIMEOUT_S, verify=self._tls or True) as client:
            answers = await asyncio.gather(*(self._read_one(client, url) for url in self.urls))
        self._apply()
        return all(answers)

    async def watch(self) -> None:
        while True:
            delay = RECHECK_S if await self.check() else RETRY_S
            await asyncio.sleep(delay)

    async def _read_one(self, client: httpx.AsyncClient, url: str) -> bool:
        try:
            response = await client.get(url)
            response.raise_for_status()
            ticktime_s = parse(response.text)
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as e:
            self._say(
                url,
                f"cannot read the broker's net_ticktime from {url} ({_reason(e)}): ORCH_LEASE_GIVE_UP_S="
                f"{self.configured_s:g} is safe only if every node's net_ticktime is at least "
                f"{self._least_safe_ticktime_s():.0f} s; enable the rabbitmq_prometheus plugin "
                "or set ORCH_BROKER_METRICS_URLS (none: do not check)",
                logging.WARNING,
            )
            return False
        self._read[url] = ticktime_s
        if ticktime_s > SHIPPED_S:
            self._say(
                url,
                f"broker net_ticktime is {ticktime_s:g} s at {url}: a node cut off from the others keeps its "
                f"services' observers stopped for up to {cut_costs_s(ticktime_s):.0f} s before the others run "
                f"them; set net_ticktime = {SHIPPED_S:g} on every node (deploy/rabbitmq/cluster.conf)",
                logging.WARNING,
            )
        else:
            self._say(url, f"broker net_ticktime is {ticktime_s:g} s at {url}", logging.INFO)
        return True

    def _least_safe_ticktime_s(self) -> float:
        return (self.configured_s + self._renewal_s + MARGIN_S - topology.HAND_ON_AFTER_MS / 1000) / 0.75

    def _apply(self) -> None:
        if not self._read:
            return
        url, ticktime_s = min(self._read.items(), key=lambda item: item[1])
        give_up_s = safe_give_up(self.configured_s, ticktime_s, self._renewal_s)
        if give_up_s == self.give_up_s:
            return
        if give_up_s < self.configured_s:
            logger.warning(
                "lease give-up lowered from ORCH_LEASE_GIVE_UP_S=%g to %.2f s: net_ticktime %g s at %s lets the "
                "other nodes hand a cut-off node's starts on %.1f s after the cut, and its sessions must have "
                "ended before that",
                self.configured_s,
                give_up_s,
                ticktime_s,
                url,
                handed_on_after_s(ticktime_s),
            )
        else:
            logger.info("lease give-up back to ORCH_LEASE_GIVE_UP_S=%g s", give_up_s)
        self.give_up_s = give_up_s
        metrics.LEASE_GIVE_UP.set(give_up_s)

    def _say(self, url: str, text: str, level: int) -> None:
        if self._said.get(url) != text:
            self._said[url] = text
            logger.log(level, "%s", text)


def _reason(error: Exception) -> str:
    if isinstance(error, httpx.HTTPStatusError):
        return f"HTTP {error.response.status_code}"
    return str(error) or type(error).__name__
