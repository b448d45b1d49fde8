"""Consumes the state queue: decode, apply in batches, publish follow-ups, ack.

Deliveries are applied by one worker in delivery order, so the reports of one service are
applied in the order it sent them. Whatever is waiting when the worker is free (up to
``max_batch``) is applied in one transaction, its rows locked and loaded up front, and then
acked with one ``multiple`` ack: a catching-up manager applies thousands of reports per
second instead of paying a transaction per message.

Messages are decoded as they arrive, not when their batch begins: the worker spends most of
a large batch waiting for PostgreSQL, and decoding the next batch meanwhile takes it off the
path every report waits on. That pays where PostgreSQL has cores of its own (figures:
docs/design.md, "What grows with the fleet").

Follow-ups (stops, isolations, requests) are published, and the batch acked, by a second
task while the worker applies the next batch: a transaction never waits for the previous
batch's confirms, which in a failover are on the path every start report waits on (figures:
the same section). The publisher takes batches in the order they committed, so follow-ups go
out in that order and each batch is acked only after its follow-ups were published; at most
``_PUBLISH_AHEAD`` committed batches wait for it (the state queue's prefetch bounds the
rest).

* A body that is not a valid report is dead-lettered to ``orch.state.error`` with a log line.
* Observer reports are applied once: their message ids are recorded in the same transaction
  (``applied_state_messages``), so a batch delivered again (the manager killed after its
  commit and before its ack, or its channel lost in between) is skipped. Replayed, a start
  report of an old service would be judged a move and stop the only live copy, and a hand-over
  would take an observer that came back to the same service off it.
* The database unreachable, not serving, or a lost race (``manager.db.errors.is_transient``):
  the batch is retried as a whole, nothing acked.
* Any other failure: the batch is applied again one message per transaction, and the
  message that fails is dead-lettered, so one bad report never blocks the others.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from aio_pika.abc import AbstractIncomingMessage
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db import applied
from manager.db.errors import database_outage, describe, is_transient
from manager.metrics import STATE_APPLIED, STATE_BATCHES, STATE_BUSY
from manager.state.follow_ups import FollowUps
from manager.state.rules import StateRules
from shared import tracing
from shared.errors import BrokerUnavailable, DecodeError
from shared.gc_pause import paused_collection
from shared.messages import (
    OBSERVER_REPORT_TYPES,
    ObserversHandedOver,
    ObserversStarted,
    ReportBatch,
    StartsGone,
    StateMessage,
    decode_state,
)

logger = logging.getLogger(__name__)

_DB_RETRY_S = 1.0
_PUBLISH_AHEAD = 4
# The first batch waits for deliveries that keep arriving at least every _ARRIVAL_GAP_S.
_FIRST_BATCH_WAIT_S = 1.0
_ARRIVAL_GAP_S = 0.02

Delivery = tuple[AbstractIncomingMessage, StateMessage]


class StateConsumer:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        broker: BrokerLink,
        rules: StateRules,
        max_batch: int = 1000,
        on_database_error: Callable[[], None] | None = None,
    ) -> None:
        self.sessions = sessions
        self.broker = broker
        self.rules = rules
        self.max_batch = max_batch
        self.applied = 0
        self._inbox: asyncio.Queue[Delivery] = asyncio.Queue()
        self._busy = False
        # Committed batches whose follow-ups are not published (and deliveries not acked) yet.
        self._committed: asyncio.Queue[tuple[FollowUps, list[Delivery]]] = asyncio.Queue(_PUBLISH_AHEAD)
        self._publishing = False
        self._database = database_outage("applying state reports", logger, on_database_error)

    def idle(self) -> bool:
        """Nothing received and not yet applied, published and acked."""
        return self._inbox.empty() and not self._busy and self._committed.empty() and not self._publishing

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        began = time.perf_counter()
        try:
            report = decode_state(message.body)
        except DecodeError as e:
            logger.error("dead-lettering a malformed state message %r: %s", message.body[:200], e)
            # Settled at once: a later batch's multiple-ack does not settle it again (RabbitMQ
            # acks only the tags still outstanding), and a failed one would requeue it.
            with contextlib.suppress(Exception):
                await message.reject(requeue=False)
            return
        finally:
            STATE_BUSY.labels("decode").inc(time.perf_counter() - began)
        self._inbox.put_nowait((message, report))

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._apply_loop())
            tasks.create_task(self._publish_loop())

    async def _apply_loop(self) -> None:
        first = True
        while True:
            deliveries = [await self._inbox.get()]
            if first:
                await self._while_arriving()
                first = False
            while len(deliveries) < self.max_batch and not self._inbox.empty():
                deliveries.append(self._inbox.get_nowait())
            self._busy = True
            began = time.perf_counter()
            try:
                # Linked to the span of each start a report tells of (none: no span).
                headers = (message.headers for message, _ in deliveries) if tracing.active() else ()
                with tracing.linked_span("apply reports", headers, {"orch.reports": len(deliveries)}):
                    follow_ups, applied = await self._apply(deliveries)
                await self._committed.put((follow_ups, applied))
            finally:
                self._busy = False
            STATE_BATCHES.inc()
            elapsed_ms = (time.perf_counter() - began) * 1000
            if logger.isEnabledFor(logging.DEBUG):
                kinds = collections.Counter(type(report).__name__ for _, report in deliveries)
                logger.debug("applied %d state message(s) in %.1f ms: %s", len(deliveries), elapsed_ms, dict(kinds))

    async def _while_arriving(self) -> None:
        """Before the first batch: once a delivery came, wait while more keep arriving (up to
        ``max_batch``, at most ``_FIRST_BATCH_WAIT_S``). A manager that starts with a backlog
        gets it pushed up to the prefetch within moments; a first delivery applied alone is a
        transaction of its own, and a goodbye would write every row of its service only for
        the next batch to move them again (figures: docs/design.md, "Two processes for the
        manager")."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _FIRST_BATCH_WAIT_S
        arrived = -1
        while arrived < self._inbox.qsize() < self.max_batch and loop.time() < deadline:
            arrived = self._inbox.qsize()
            await asyncio.sleep(_ARRIVAL_GAP_S)

    async def _publish_loop(self) -> None:
        """Publish each committed batch's follow-ups, then ack its deliveries, in commit order."""
        while True:
            follow_ups, applied = await self._committed.get()
            self._publishing = True
            try:
                publishing = time.perf_counter()
                await self._publish(follow_ups)
                acking = time.perf_counter()
                STATE_BUSY.labels("publish").inc(acking - publishing)
                await self._ack(applied)
                STATE_BUSY.labels("ack").inc(time.perf_counter() - acking)
            finally:
                self._publishing = False

    async def _apply(self, deliveries: list[Delivery]) -> tuple[FollowUps, list[Delivery]]:
        """Apply in one transaction; on a deterministic failure fall back to one report
        per transaction. Returns the follow-ups to publish and the deliveries to ack
        (applied ones)."""
        began = time.perf_counter()
        try:
            follow_ups = await self._transaction([report for _, report in deliveries])
        except Exception:
            follow_ups = FollowUps()
            applied: list[Delivery] = []
            if len(deliveries) > 1:
                for delivery in deliveries:
                    one_follow_ups, one_applied = await self._apply([delivery])
                    follow_ups.add(one_follow_ups)
                    applied += one_applied
                return follow_ups, applied
            # A report we cannot apply is a bug or a contract mismatch: keep it for a human
            # in the error queue rather than block every other report.
            message, report = deliveries[0]
            logger.exception("dead-lettering %s that could not be applied", type(report).__name__)
            with contextlib.suppress(Exception):
                await message.reject(requeue=False)
            return follow_ups, applied
        STATE_BUSY.labels("transaction").inc(time.perf_counter() - began)
        self.applied += len(deliveries)
        STATE_APPLIED.inc(len(deliveries))
        return follow_ups, deliveries

    async def _transaction(self, reports: Sequence[StateMessage]) -> FollowUps:
        """One transaction for all ``reports``, retried while the database is unreachable."""
        while True:
            follow_ups = FollowUps()
            try:
                # A catch-up's batch builds a row, a change and two events per observer, and
                # the collector's passes over them were about a fifth of its transaction
                # (figures: docs/bench-history.md, "2026-11-27, first and second sessions").
                # See ``shared.gc_pause``.
                with paused_collection():
                    async with self.sessions.begin() as session:
                        fresh = await _first_time(session, reports)
                        await self.rules.preload(session, fresh)
                        now = datetime.now(UTC)
                        for report in fresh:
                            follow_ups.add(await self.rules.apply(session, report, now))
                        await self.rules.flush(session)
                self._database.worked()
                self.rules.committed(follow_ups)
                return follow_ups
            except Exception as e:
                if not is_transient(e):
                    raise
                self._database.failed(describe(e))  # said once, and once a minute, not per attempt
                await asyncio.sleep(_DB_RETRY_S)

    async def _publish(self, follow_ups: FollowUps) -> None:
        for follow_up in follow_ups.batched():
            try:
                await self.broker.publish_control(follow_up)
            except BrokerUnavailable as e:
                # Re-stops and inventories are repeated by the background loops.
                logger.warning("could not publish %s: %s", type(follow_up).__name__, e)

    @staticmethod
    async def _ack(deliveries: list[Delivery]) -> None:
        """Ack what was applied. A channel closed meanwhile (aio-pika's ``message.channel``
        then raises) voids their tags: the broker redelivers them and ``_first_time`` skips
        them. Escaping here, that error would end the state process (docs/cost-curve.md)."""
        if not deliveries:
            return
        last = deliveries[-1][0]
        with contextlib.suppress(Exception):
            if all(m.channel is last.channel for m, _ in deliveries):
                await last.ack(multiple=True)
            else:  # a reconnect happened mid-batch: the old channel's tags are void anyway
                for message, _ in deliveries:
                    await message.ack()


# A hand-over applied again after its observer came back to the same service (same session)
# would take the copy running there off it.
_ONCE_ONLY = (*OBSERVER_REPORT_TYPES, ObserversStarted, ObserversHandedOver, StartsGone, ReportBatch)


async def _first_time(session: AsyncSession, reports: Sequence[StateMessage]) -> list[StateMessage]:
    """The reports not applied before; records the observer reports' ids as applied (in the
    caller's transaction). Service messages (birth, heartbeats, inventories, goodbyes) are
    idempotent and not recorded: they are most of the traffic."""
    once = [r.message_id for r in reports if isinstance(r, _ONCE_ONLY)]
    if not once:
        return list(reports)
    claimed = await applied.claim(session, once)
    fresh = [r for r in reports if not isinstance(r, _ONCE_ONLY) or r.message_id in claimed]
    if len(fresh) < len(reports):
        logger.warning("skipped %d state message(s) applied before (delivered again)", len(reports) - len(fresh))
    return fresh
