"""Settling start deliveries: ack, nack, reject, and acking only once a report is confirmed.

A delivery is the lease of a running observer (docs/design.md, "Invariants"): settling it gives the observer
away, so a stop acks only after the broker confirmed the ``ObserverStopped`` that says so
(``until_confirmed``), and never once the delivery's session died (its work channel may
still be open for a moment, but the report may never arrive; the broker requeues it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any

from observer_service.session import Session
from observer_service.settle_queue import DeliveryChannel


async def until_confirmed(confirmed: asyncio.Future[bool], sessions: set[Session]) -> bool:
    """Wait for the broker's confirm of a report (True), or for a session to die (False):
    its deliveries must then not be acked, even if its work channel is not closed yet, since
    the report may never arrive; the broker requeues them when the session closes."""
    closing: list[asyncio.Future[Any]] = [asyncio.ensure_future(session.closed.wait()) for session in sessions]
    try:
        await asyncio.wait([confirmed, *closing], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in closing:
            waiter.cancel()
    return confirmed.done() and confirmed.result() and not any(s.closed.is_set() for s in sessions)


async def ack_once_confirmed(
    session: Session, channel: DeliveryChannel, tag: int, confirmed: asyncio.Future[bool]
) -> None:
    if await until_confirmed(confirmed, {session}):
        await settle(session.ack(channel, tag))


async def settle(operation: Awaitable[Any]) -> None:
    """Ack/nack/reject, ignoring a channel that is already gone (the broker requeued)."""
    with contextlib.suppress(Exception):
        await operation
