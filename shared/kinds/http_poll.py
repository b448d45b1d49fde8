"""``http_poll``: GETs a URL every ``interval_s`` and emits when the answer changes.

An event ``{"status", "sha256", "changed", "body"?, "truncated"?}`` is emitted for the first
response and then only when the status code or the SHA-256 of the body differs from the last
response (``changed`` names which: ``["status", "body"]`` for the first). Any HTTP status is a
response; connection errors and timeouts are errors: logged and counted, and after
``max_consecutive_errors`` of them in a row the observer raises ``HttpPollError`` (the retry
policy then restarts or fails it). A response resets the count.

Per observer only the last status and hash are kept; the body is streamed through the hash
and at most ``max_body_bytes`` of it are held.

Every connection, redirects included, goes only where the service's egress policy allows
(``ORCH_EGRESS_ALLOW`` / ``ORCH_EGRESS_DENY``, ``shared.egress``): a refused address raises
``EgressDenied`` at once, not counted among the connection errors. Environment proxies and
``.netrc`` are not used (``trust_env=False``): through a proxy the policy would see only the
proxy, and a caller-chosen URL must not pick up the host's stored credentials.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import random
import ssl
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field

from shared.egress import current_policy
from shared.kinds.checked_http import checked_transport
from shared.kinds.periodic import next_slot
from shared.observer_api import ObserverContext, ObserverKind


class HttpPollError(Exception):
    """Too many consecutive failed requests."""


class HttpPollArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: AnyHttpUrl = Field(description="http(s) URL to GET")
    interval_s: float = Field(
        default=60.0, gt=0, le=86_400, description="seconds between request starts (fixed grid, random phase)"
    )
    timeout_s: float = Field(
        default=10.0, gt=0, le=600, description="limit of one request, connect to last body byte; over it = error"
    )
    headers: dict[str, str] = Field(default_factory=dict, description="extra request headers")
    follow_redirects: bool = Field(default=False, description="follow 3xx answers (else a 3xx is the response)")
    max_body_bytes: int = Field(
        default=4096,
        ge=0,
        le=1_048_576,
        description="emit at most this many bytes of the body as text (0 = omit the body); the hash covers all",
    )
    max_consecutive_errors: int = Field(
        default=5, ge=1, le=1_000_000, description="connection errors/timeouts in a row before the observer raises"
    )


@dataclass(frozen=True)
class Snapshot:
    status: int
    sha256: str
    head: bytes  # at most max_body_bytes of the body
    truncated: bool


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # One verified context per process: building one per client costs milliseconds of CPU
    # and hundreds of KiB, times thousands of pollers.
    return httpx.create_ssl_context()


async def fetch(client: httpx.AsyncClient, args: HttpPollArgs) -> Snapshot:
    """One GET, streamed: hash everything, keep the head."""
    digest, head, size = hashlib.sha256(), bytearray(), 0
    async with asyncio.timeout(args.timeout_s), client.stream("GET", str(args.url)) as response:
        async for chunk in response.aiter_bytes():
            digest.update(chunk)
            size += len(chunk)
            if len(head) < args.max_body_bytes:
                head += chunk[: args.max_body_bytes - len(head)]
    return Snapshot(response.status_code, digest.hexdigest(), bytes(head), size > len(head))


def changes(previous: tuple[int, str] | None, current: Snapshot) -> list[str]:
    """What differs from the previous ``(status, sha256)``; both for the first response."""
    if previous is None:
        return ["status", "body"]
    status, sha256 = previous
    changed = []
    if status != current.status:
        changed.append("status")
    if sha256 != current.sha256:
        changed.append("body")
    return changed


def event(snapshot: Snapshot, changed: list[str], args: HttpPollArgs) -> dict[str, Any]:
    payload: dict[str, Any] = {"status": snapshot.status, "sha256": snapshot.sha256, "changed": changed}
    if args.max_body_bytes:
        payload["body"] = snapshot.head.decode("utf-8", errors="replace")
        payload["truncated"] = snapshot.truncated
    return payload


async def run(args: HttpPollArgs, ctx: ObserverContext) -> None:
    loop = asyncio.get_running_loop()
    last: tuple[int, str] | None = None  # (status, sha256): all that is kept between polls
    errors, slot = 0, 0
    async with httpx.AsyncClient(
        headers=args.headers,
        follow_redirects=args.follow_redirects,
        timeout=args.timeout_s,
        transport=checked_transport(current_policy(), _ssl_context()),
        trust_env=False,
    ) as client:
        # A random phase, so that thousands of pollers created at once do not fire together;
        # at most a few seconds, so that a new poller answers soon even with a long interval.
        origin = loop.time() + random.uniform(0, min(args.interval_s, 5.0))
        await asyncio.sleep(origin - loop.time())
        while True:
            ctx.ensure_lease()
            try:
                current = await fetch(client, args)
            except (httpx.HTTPError, TimeoutError) as e:
                errors += 1
                error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                ctx.logger.warning("GET %s failed (%d in a row): %s", args.url, errors, error)
                if errors >= args.max_consecutive_errors:
                    raise HttpPollError(f"{errors} consecutive errors, last: {error}") from e
            else:
                errors = 0
                changed = changes(last, current)
                last = (current.status, current.sha256)
                if changed:
                    await ctx.emit(event(current, changed, args))
            slot = next_slot(origin, args.interval_s, slot, loop.time())
            await asyncio.sleep(max(0.0, origin + slot * args.interval_s - loop.time()))


KIND: ObserverKind[HttpPollArgs] = ObserverKind(
    name="http_poll",
    args_model=HttpPollArgs,
    run=run,
    description="GETs url every interval_s; emits status, body hash and body when either changes",
)
