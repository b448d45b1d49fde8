"""Consumes the state queue: decode, apply in one transaction, publish follow-ups, ack.

Messages are applied one at a time in delivery order, so the reports of one service are
applied in the order it sent them. A body that is not a valid report is dead-lettered to
``orch.state.error`` with a log line; a database error leaves the message unacked and
retried (the broker redelivers it), so nothing is lost while PostgreSQL is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime

from aio_pika.abc import AbstractIncomingMessage
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.state.rules import StateRules
from shared.errors import BrokerUnavailable, DecodeError
from shared.messages import decode_state

logger = logging.getLogger(__name__)

_DB_RETRY_S = 1.0


class StateConsumer:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], broker: BrokerLink, rules: StateRules) -> None:
        self.sessions = sessions
        self.broker = broker
        self.rules = rules
        self.applied = 0
        # One message at a time, in delivery order, even though aio-pika dispatches each
        # delivery to its own task.
        self._lock = asyncio.Lock()

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        async with self._lock:
            await self._handle(message)

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        try:
            report = decode_state(message.body)
        except DecodeError as e:
            logger.error("dead-lettering a malformed state message %r: %s", message.body[:200], e)
            with contextlib.suppress(Exception):
                await message.reject(requeue=False)
            return
        while True:
            try:
                async with self.sessions.begin() as session:
                    outgoing = await self.rules.apply(session, report, datetime.now(UTC))
                break
            except Exception as e:
                if not _is_transient(e):
                    # A report we cannot apply is a bug or a contract mismatch: keep it for
                    # a human in the error queue rather than block every other report.
                    logger.exception("dead-lettering %s that could not be applied", report.type)
                    with contextlib.suppress(Exception):
                        await message.reject(requeue=False)
                    return
                logger.warning("applying %s failed (%s); retrying in %.0fs", report.type, e, _DB_RETRY_S)
                await asyncio.sleep(_DB_RETRY_S)
        for follow_up in outgoing.messages:
            try:
                await self.broker.publish_control(follow_up)
            except BrokerUnavailable as e:
                # Re-stops and inventories are repeated by the background loops.
                logger.warning("could not publish %s: %s", type(follow_up).__name__, e)
        with contextlib.suppress(Exception):
            await message.ack()
        self.applied += 1


def _is_transient(error: Exception) -> bool:
    """True when the database is unreachable (retry), False for a deterministic failure."""
    if isinstance(error, OSError | TimeoutError | InterfaceError | OperationalError):
        return True
    return isinstance(error, DBAPIError) and bool(error.connection_invalidated)
