"""An httpx transport whose every TCP connection passes the service's egress policy
(``shared.egress``): the first request, each redirect ``follow_redirects`` takes, each new
keep-alive connection.

httpx resolves and connects inside httpcore's network backend, so the check sits there: the
backend resolves the host itself, checks every address and hands httpcore's own backend an
IP it checked. TLS still verifies the certificate against the URL's host name (httpcore
takes the server name from the request, not from the address connected to).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

from shared.egress import EgressPolicy, checked_addresses


class CheckedBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, policy: EgressPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        # Resolution errors and timeouts become httpcore's, which httpx turns into its
        # ConnectError / ConnectTimeout as it did before; EgressDenied passes untouched.
        try:
            async with asyncio.timeout(timeout):
                infos = await checked_addresses(host, port, self._policy)
        except TimeoutError as e:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from e
        except OSError as e:
            raise httpcore.ConnectError(f"cannot resolve {host}: {e}") from e
        error: httpcore.ConnectError | None = None
        for *_, sockaddr in infos:  # the checked addresses only, in the resolver's order
            try:
                return await self._inner.connect_tcp(str(sockaddr[0]), port, timeout, local_address, socket_options)
            except httpcore.ConnectError as e:
                error = e
        raise error or httpcore.ConnectError(f"{host} resolves to no address")

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not reachable through the egress policy")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def checked_transport(policy: EgressPolicy, verify: ssl.SSLContext) -> httpx.AsyncHTTPTransport:
    """An ``AsyncHTTPTransport`` connecting through ``CheckedBackend``. httpx has no option
    for httpcore's network backend, so its pool is replaced by one built with it and with
    httpx's own defaults (limits, HTTP/1.1, no proxy). ``tests/system/test_kinds.py`` proves
    through httpx that the check applies."""
    # httpx's default limits (its transport's default argument): a poller makes one request
    # at a time, but an idle connection must close after 5 s, not stay open per poller.
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)
    transport = httpx.AsyncHTTPTransport(verify=verify, limits=limits)
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=verify,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=CheckedBackend(policy),
    )
    return transport
