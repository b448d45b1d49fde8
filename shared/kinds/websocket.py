"""``websocket``: keeps a WebSocket connection open and emits every message it receives.

After connecting it sends ``subscribe`` (if given: a string as is, a JSON object or array
serialised), then emits ``{"message": <the message parsed as JSON, else its text>}`` for each
message: an exchange price feed, say. A dropped connection, or one that could not be opened,
is a *failure*: it is retried after an exponential, jittered backoff (``initial_backoff_s``
doubling up to ``max_backoff_s``). After ``max_consecutive_failures`` failures in a row the
observer raises ``WebSocketError`` (the retry policy then restarts or fails it). A connection
that stayed open for ``stable_after_s`` resets the count and the backoff. Pings (websockets'
defaults, every 20 s) detect a silently dead peer.

The TCP connection is opened here, to an address the service's egress policy allows
(``ORCH_EGRESS_ALLOW`` / ``ORCH_EGRESS_DENY``, ``shared.egress``), and handed to websockets:
a refused address raises ``EgressDenied`` at once. Hence no proxy from the environment, and
a redirect of the handshake is not followed (a failed connection that names the target).
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import ssl
from typing import Any, Self

from pydantic import AnyWebsocketUrl, BaseModel, ConfigDict, Field, model_validator
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException

from shared.backoff import backoff_delay
from shared.egress import EgressPolicy, connect_socket, current_policy
from shared.observer_api import ObserverContext, ObserverKind


class WebSocketError(Exception):
    """Too many consecutive failed connections."""


class WebSocketArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: AnyWebsocketUrl = Field(description="ws:// or wss:// URL to connect to")
    subscribe: dict[str, Any] | list[Any] | str | None = Field(
        default=None, description="message sent after each (re)connection: a string as is, JSON otherwise"
    )
    headers: dict[str, str] = Field(default_factory=dict, description="extra handshake headers")
    open_timeout_s: float = Field(default=10.0, gt=0, le=600, description="limit of connect + handshake")
    initial_backoff_s: float = Field(default=1.0, gt=0, le=3600, description="delay before the first reconnect")
    max_backoff_s: float = Field(default=60.0, gt=0, le=86_400, description="the backoff doubles up to this delay")
    max_consecutive_failures: int | None = Field(
        default=10,
        ge=1,
        le=1_000_000,
        description="failed or dropped connections in a row before the observer raises; null = retry forever",
    )
    stable_after_s: float = Field(
        default=10.0, ge=0, le=86_400, description="a connection open this long resets the failure count"
    )
    max_message_bytes: int = Field(
        default=1_048_576, ge=1024, le=64 * 1_048_576, description="a bigger message closes the connection"
    )

    @model_validator(mode="after")
    def _backoff_bounds(self) -> Self:
        if self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("max_backoff_s must be >= initial_backoff_s")
        return self


def parse(raw: str | bytes) -> Any:
    """A message as JSON if it is JSON, else as text (bytes decoded as UTF-8)."""
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    try:
        return json.loads(text)
    except ValueError:
        return text


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # One context per process instead of one per connection (CPU and memory, times thousands).
    return ssl.create_default_context()


async def _session(ws: ClientConnection, args: WebSocketArgs, ctx: ObserverContext) -> str:
    """Subscribe, then emit every message until the server closes; the close as text."""
    if args.subscribe is not None:
        ctx.ensure_lease()
        await ws.send(args.subscribe if isinstance(args.subscribe, str) else json.dumps(args.subscribe))
    async for raw in ws:
        await ctx.emit({"message": parse(raw)})
    return f"closed by the server (code {ws.close_code}, reason {ws.close_reason!r})"


async def _open_socket(args: WebSocketArgs, policy: EgressPolicy, deadline: float) -> socket.socket:
    host, port = args.url.host, args.url.port
    if host is None or port is None:  # the URL type guarantees both; this tells mypy
        raise ValueError(f"{args.url} names no host and port")
    async with asyncio.timeout_at(deadline):
        return await connect_socket(host, port, policy)


async def run(args: WebSocketArgs, ctx: ObserverContext) -> None:
    loop = asyncio.get_running_loop()
    url = str(args.url)
    policy = current_policy()
    failures = 0
    while True:
        opened_at: float | None = None
        ctx.ensure_lease()
        try:
            # One open_timeout_s for the TCP connection and the handshake together.
            deadline = loop.time() + args.open_timeout_s
            async with connect(
                url,
                sock=await _open_socket(args, policy, deadline),
                additional_headers=args.headers,
                open_timeout=max(0.001, deadline - loop.time()),
                max_size=args.max_message_bytes,
                ssl=_ssl_context() if url.startswith("wss:") else None,
            ) as ws:
                opened_at = loop.time()
                ctx.logger.info("connected to %s", url)
                reason = await _session(ws, args, ctx)
        except (OSError, TimeoutError, WebSocketException) as e:
            reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        except ValueError as e:
            if not isinstance(e.__cause__, InvalidStatus):
                raise
            # websockets cannot follow a redirect on a socket it was given; each hop would
            # also need the egress check: a failed connection, with the target named.
            reason = f"{e} (redirects are not followed: use the final URL)"
        if opened_at is not None and loop.time() - opened_at >= args.stable_after_s:
            failures = 0
        failures += 1
        if args.max_consecutive_failures is not None and failures >= args.max_consecutive_failures:
            raise WebSocketError(f"{failures} consecutive failed connections to {url}, last: {reason}")
        delay = backoff_delay(failures, args.initial_backoff_s, args.max_backoff_s)
        ctx.logger.warning("%s: %s (%d in a row); reconnecting in %.1fs", url, reason, failures, delay)
        await asyncio.sleep(delay)


KIND: ObserverKind[WebSocketArgs] = ObserverKind(
    name="websocket",
    args_model=WebSocketArgs,
    run=run,
    description="keeps a WebSocket open (subscribe, reconnect with backoff) and emits every message",
)
