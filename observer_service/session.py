"""One broker session: with ``holding.py``, the only code of the service that touches aio-pika
(and aiormq under it).

A session is two AMQP connections, so that liveness never waits behind bulk traffic, and two
threads, so that it never waits behind the observers either:
* ``holding`` (``holding.py``, a thread and event loop of its own): what makes this service the
  owner of its observers: the start deliveries, the control queue and the lease round
  trips, and nothing bulky. ``holding.py`` says why it has a thread.
* ``publish`` (this module, the main loop with the observers): publisher confirms; state
  reports, inventories and observer events (batched by ``emits.EventPublisher``, which
  writes on this connection's channel too). RabbitMQ throttles a connection that publishes
  faster than it can route (credit flow) and blocks it under a memory or disk alarm: on a
  connection of its own that throttling delays reports and emits, never the lease
  (docs/design.md, "Pauses and the lease"). It holds no delivery, so its silence proves
  nothing about ownership: its AMQP heartbeat is ``PUBLISH_HEARTBEAT_S`` (RabbitMQ's
  default), long enough that an observers' loop late by seconds is not taken for a dead peer.

Deliveries belong to the channel they came on. When either connection breaks the whole
session is dead (``closed`` is set) and every observer started from it must be cancelled at
once: the broker has requeued, or will requeue, their start messages. The service then opens
a new session. A slow broker is not a broken one: a late lease round trip pauses the
observers (the lease lapses) and is waited for; only the socket, aiormq's AMQP heartbeat
or the broker closing a connection ends a session. We deliberately do not use aio-pika's
robust connection: it would silently re-consume on a new channel while the old observers
keep running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection

from observer_service import metrics
from observer_service.emits import EventPublisher, Slots
from observer_service.holding import ControlHandler, HoldingConnection, RefusedHandler, StartHandler
from observer_service.lease import Lease
from observer_service.loop_thread import LoopThread, Mailbox
from observer_service.outbox import Outbox, Report, StartedReport, pack
from observer_service.settings import ServiceSettings
from observer_service.settle_queue import DeliveryChannel, Settle
from observer_service.start_consumers import Placement
from shared import topology, tracing
from shared.amqp_errors import describe_close, describe_connect_failure, refusal
from shared.broker_nodes import node_name
from shared.errors import BrokerRefused, BrokerUnavailable, LeaseLost
from shared.messages import Message, ObserversStarted
from shared.settings import amqp_url_with_heartbeat

logger = logging.getLogger(__name__)

ACK_TIMEOUT_HINT = (
    "the broker closed the channel because a delivery stayed unacked longer than its "
    "consumer_timeout: observers hold their start message for their whole life, so lift it "
    "(rabbitmq.conf: consumer_timeout = 315360000000, as deploy/rabbitmq/orchestrator.conf ships; "
    "and no consumer-timeout policy or x-consumer-timeout argument on the start queues)"
)

_OUTBOX_BATCH = 5_000  # reports taken per round; packed into far fewer messages
# Reports that trickle in (a burst of deliveries arrives a few at a time) wait this long for
# company before they are published: every message costs the broker, the manager and this
# service (figures: docs/design.md, "Where the time goes").
_LINGER_S = 0.02
_LINGER_BELOW = 500
MAX_PREFETCH = 65_535  # prefetch_count is a 16-bit field
# Starts held per channel. RabbitMQ finds the delivery an ack, nack or reject names by walking
# its channel's unacked deliveries from the oldest (rabbit_channel:collect_acks), so settling
# one costs time proportional to how many that channel holds. Held on channels of this
# many, each settle walks at most this far; a channel costs the broker one process (figures:
# docs/design.md, "What grows with the fleet").
HOLD_PER_CHANNEL = 4_096
PUBLISH_HEARTBEAT_S = 60  # the publish connection's AMQP heartbeat (module docstring)
# A verdict's marker watch and a question or two that may each take their timeout.
_VERDICTS_WITHIN_S = 20.0


def prefetch_chunks(workers_count: int, per_consumer: int = MAX_PREFETCH) -> list[int]:
    """Prefetch of each consumer so that together they hold ``workers_count`` deliveries."""
    full, rest = divmod(workers_count, min(per_consumer, MAX_PREFETCH))
    return [min(per_consumer, MAX_PREFETCH)] * full + ([rest] if rest else [])


class Session:
    def __init__(
        self,
        settings: ServiceSettings,
        service_id: uuid.UUID,
        lease: Lease,
        url: str,
        markers_left: list[tuple[str, str]] | None = None,
        give_up_s: float | None = None,
    ) -> None:
        self.settings = settings
        # On a cluster, a lease unrenewed this long ends the session (``net_ticktime.py``).
        self.give_up_s = settings.lease_give_up_s if give_up_s is None else give_up_s
        self.service_id = service_id
        self.url = url  # one node of the broker: both connections go to it
        # Named in start reports and inventories; a stop aimed at one copy carries it.
        self.id = uuid.uuid4()
        self.lease = lease
        self.closed = asyncio.Event()
        self.close_reason = ""
        self._publish: AbstractConnection | None = None
        self._pub: AbstractChannel | None = None
        self._events: EventPublisher | None = None
        # The holding connection and its thread (``holding.py``); settles reach it by mailbox.
        self._thread: LoopThread | None = None
        self._holding: HoldingConnection | None = None
        self._to_hold: Mailbox | None = None
        self._to_main: Mailbox | None = None  # the holding thread's way back to this loop
        self._held_back = False  # ``requeue_held`` closed the start channels on purpose
        # Emits in flight at once: past it an observer's emit waits (issue 17).
        self._emit_slots = Slots(settings.emits_in_flight)
        self._tasks: list[asyncio.Task[None]] = []
        # Queue markers of earlier sessions, deleted once open; after the close, what is left
        # of those and of this session's (``queue_watch.py``).
        self.markers_left = list(markers_left or ())

    # --- lifecycle -------------------------------------------------------------------

    async def open(
        self,
        on_start: StartHandler,
        on_control: ControlHandler,
        on_refused: RefusedHandler,
        outbox: Outbox,
        placement: Placement,
    ) -> None:
        """All called on this (the main) loop: ``on_start`` per start delivery, in order,
        ``on_control`` per control command, already acked (a malformed one is dead-lettered
        and never reaches it), and ``on_refused`` with what the broker refuses about a
        pool's start queue (``holding.RefusedHandler``). The start queues are consumed under
        ``placement`` (``start_consumers.py``)."""
        heartbeat = self.settings.amqp_heartbeat_s
        name = f"observer-service {self.settings.service_name}"
        try:
            self._publish = await aio_pika.connect(
                amqp_url_with_heartbeat(self.url, max(heartbeat, PUBLISH_HEARTBEAT_S)),
                client_properties={"connection_name": f"{name} (publish)"},
            )
            self._publish.close_callbacks.add(self._on_publish_closed)
            self._pub = await self._publish.channel(publisher_confirms=True)
            self._pub.close_callbacks.add(self._on_publish_closed)
            await topology.declare_common(self._pub, self.settings.queue_type)
            self._events = EventPublisher(await self._pub.get_underlay_channel(), self.lease, self.fail)
            self._thread = LoopThread(f"hold {self.id.hex[:8]}", self.settings.event_loop)
            self._to_hold = Mailbox(self._thread.loop)
            self._to_main = Mailbox(asyncio.get_running_loop())
            self._holding = HoldingConnection(
                self.lease,
                heartbeat,
                self._to_main,
                self._fail_from_hold,
                self.settings.queue_type,
                self.give_up_s,
                placement,
                self.settings.refused_retry_s,
            )
            chunks = prefetch_chunks(self.settings.workers_count, HOLD_PER_CHANNEL)
            holds = [(pool, chunks) for pool in self.settings.pools]
            await self._thread.call(
                self._holding.open(
                    amqp_url_with_heartbeat(self.url, heartbeat),
                    name,
                    on_start,
                    on_control,
                    self.service_id,
                    holds,
                    on_refused,
                    self.id,
                    self.markers_left,
                )
            )
        except Exception as e:
            hint = refusal(e, self.url)
            why = hint or f"{node_name(self.url)}: {describe_connect_failure(e, self.url)}"
            await self.close(f"open failed: {why}", quiet=True)
            if hint is not None:
                raise BrokerRefused(f"cannot open a broker session: {hint}", hint) from e
            raise BrokerUnavailable(why) from e
        self._tasks = [asyncio.create_task(self._outbox_loop(outbox), name="outbox")]
        logger.info(
            "broker session open on %s (pools=%s, prefetch=%d)",
            node_name(self.url),
            self.settings.pools,
            self.settings.workers_count,
        )

    def _on_publish_closed(self, _sender: Any, exc: BaseException | None) -> None:
        heartbeat = max(self.settings.amqp_heartbeat_s, PUBLISH_HEARTBEAT_S)
        self.fail(describe_close(exc, heartbeat), exc)

    def _fail_from_hold(self, reason: str, exc: BaseException | None) -> None:
        """The holding connection is gone (called on its thread). The lease goes at once, so
        no observer acts from now on; the rest of ``fail`` runs on the main loop."""
        if self.closed.is_set():
            return
        self.lease.revoke()
        if self._to_main is not None:
            self._to_main.post(self.fail, reason, exc)

    def fail(
        self, reason: str, exc: BaseException | None = None, *, expected: bool = False, quiet: bool = False
    ) -> None:
        """Mark the session dead. Safe to call many times and from callbacks (main loop).
        ``quiet``: a session that never opened, whose caller says the outage
        (``shared.outage``), logs its end at DEBUG."""
        if self.closed.is_set():
            return
        self.lease.revoke()
        self.close_reason = reason
        if exc is not None and "acknowledgement" in str(exc) and "timed out" in str(exc):
            logger.error("%s (%s)", ACK_TIMEOUT_HINT, exc)
        elif expected:
            logger.log(logging.DEBUG if quiet else logging.INFO, "broker session closed: %s", reason)
        else:
            logger.warning("broker session lost: %s", reason)
        if not expected:
            metrics.SESSIONS_LOST.inc()
        self.closed.set()

    async def close(self, reason: str = "closing", *, quiet: bool = False) -> None:
        self.fail(reason, expected=True, quiet=quiet)
        if self._events is not None:
            await self._events.close(self.close_reason or reason)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        if self._publish is not None and not self._publish.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._publish.close(), 5)
        if self._thread is not None:
            if self._holding is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._thread.call(self._holding.close()), 10)
                self.markers_left = self._holding.markers_left
            await self._thread.stop()

    async def stop_consuming(self) -> None:
        """Cancel the start consumers for good: no new observers, the held deliveries stay ours."""
        if self._thread is not None and self._holding is not None:
            await self._thread.call(self._holding.starts.stop())

    async def place(self, placement: Placement) -> None:
        """Take new starts under ``placement`` from now on (a new consumer priority, or a
        cordon); a session that cannot consume again is failed like any broken session."""
        if self._thread is None or self._holding is None or self.closed.is_set():
            return
        try:
            await self._thread.call(self._holding.place(placement))
        except Exception as e:  # noqa: BLE001 - the channel or connection is gone
            self.fail(f"consuming the start queues again failed: {e!r}", e)

    async def step_aside(self, pool: str, for_s: float) -> None:
        """Consume ``pool`` below every other service for ``for_s`` (``start_consumers.py``):
        returns once it does, so a start handed back next goes to another service first."""
        if self._thread is None or self._holding is None or self.closed.is_set():
            return
        try:
            await self._thread.call(self._holding.starts.step_aside(pool, for_s))
        except Exception as e:  # noqa: BLE001 - the channel or connection is gone
            self.fail(f"stepping aside from pool {pool} failed: {e!r}", e)

    async def deleted_pools(self) -> set[str]:
        """Pools whose start queue was deleted while this session held starts from it, once
        the broker has answered for each cancelled consumer (``queue_watch.VERDICT_WITHIN_S``);
        called after the fence, before the close."""
        if self._thread is None or self._holding is None:
            return set()
        try:
            return await asyncio.wait_for(self._thread.call(self._holding.deleted_pools()), _VERDICTS_WITHIN_S)
        except Exception:  # noqa: BLE001 - no answer: no evidence of a deletion
            return self._holding.gone_pools

    @property
    def placement(self) -> Placement | None:
        """The placement the start consumers consume under (None before they exist)."""
        return None if self._holding is None else self._holding.starts.placement

    # --- settling start deliveries --------------------------------------------------------
    # Each is handed to the holding thread in order and sent there; the caller does not
    # wait for the frame to be written (nothing would come back: AMQP does not confirm a
    # settle). Order against ``requeue_held`` holds: it sends what was posted before it.

    async def ack(self, channel: DeliveryChannel, tag: int) -> None:
        """Settle a start delivery of this session: the observer is given away (stopped)."""
        self._settle("ack", channel, tag)

    async def requeue(self, channel: DeliveryChannel, tag: int) -> None:
        """Hand a start back to the queue, for any service of the pool to take."""
        self._settle("requeue", channel, tag)

    async def reject(self, channel: DeliveryChannel, tag: int) -> None:
        """Dead-letter a start (to the pool's error queue): never run again."""
        self._settle("reject", channel, tag)

    def _settle(self, operation: Settle, channel: DeliveryChannel, tag: int) -> None:
        # Once its channel is closed (a dead session, or ``requeue_held``) a delivery is the
        # broker's again: settling it is an error (``settle`` ignores it).
        if self._held_back or channel.is_closed or self._to_hold is None or self._holding is None:
            raise BrokerUnavailable("the channel of this delivery is closed: it went back to the queue")
        self._to_hold.post(self._holding.settles.post, operation, channel, tag)

    async def ack_taken(self, deliveries: list[tuple[DeliveryChannel, int]]) -> bool | None:
        """Ack these deliveries and wait until the broker has taken the acks (True). None: not
        acked, the session is ending and the broker takes them back; False: acked, but whether
        the broker took the acks is not known (``SettleQueue.ack_taken``)."""
        if self._held_back or self._thread is None or self._holding is None or self.closed.is_set():
            return None
        try:
            return await self._thread.call(self._holding.settles.ack_taken(deliveries))
        except Exception:  # noqa: BLE001 - the holding thread is gone with the session
            return False

    def queue_held(self) -> list[int]:
        """The starts held from each start queue index, over every pool; empty while every
        queue consumed is the first of its pool (``ServiceHeartbeat.queue_held``)."""
        counts = [] if self._holding is None else self._holding.starts.held_by_index()
        return counts if len(counts) > 1 else []

    def queue_index(self, channel: DeliveryChannel) -> int | None:
        """Which of its pool's start queues a delivery on ``channel`` came from (None: not known)."""
        return None if self._holding is None else self._holding.starts.index_of(channel)

    async def requeue_held(self) -> None:
        """Give every held delivery back to the broker at once, by closing the channels that
        hold them: the broker requeues a closed channel's unacked deliveries as one batch.
        Nacking them one by one costs RabbitMQ time that grows faster than their number (each
        nack walks the channel's unacked deliveries: see ``HOLD_PER_CHANNEL``), and the queue
        serves nobody meanwhile (figures: docs/benchmarks.md). The rest of the session (the
        lease, the outbox, the control queue) stays open."""
        self._held_back = True
        if self._thread is not None and self._holding is not None:
            await self._thread.call(self._holding.requeue_held())

    # --- publishing --------------------------------------------------------------------

    async def publish(
        self, routing_key: str, message: aio_pika.Message, exchange: str = "", *, mandatory: bool = True
    ) -> None:
        """Publish and wait for the broker's confirm."""
        if self._pub is None or self.closed.is_set():
            raise BrokerUnavailable("no broker session")
        target = self._pub.default_exchange if not exchange else await self._pub.get_exchange(exchange, ensure=False)
        await target.publish(message, routing_key=routing_key, mandatory=mandatory)

    async def emit_event(self, routing_key: str, body: bytes) -> None:
        """Publish an observer's event. At most ``emits_in_flight`` wait for their confirms at
        once; past that an emit waits for a slot (the observer is slowed down, nothing is
        dropped) and is counted in ``orch_service_emits_delayed``. Any failure means the
        channel is gone (or going): the observer must stop acting, so it gets ``LeaseLost``."""
        self.lease.ensure()
        if self._emit_slots.full():
            metrics.EMITS_DELAYED.inc()
        with metrics.EMITS_WAITING.track_inprogress():
            await self._emit_slots.acquire()
        try:
            self.lease.ensure()  # it may have lapsed while the emit waited
            if self._events is None or self.closed.is_set():
                raise BrokerUnavailable("no broker session")
            await self._events.publish(routing_key, body)  # batched with other emits (emits.py)
        except LeaseLost:
            raise
        except Exception as e:
            self.fail(f"event publish failed: {e!r}")
            raise LeaseLost(f"cannot emit: {e!r}") from e
        finally:
            self._emit_slots.release()

    async def _outbox_loop(self, outbox: Outbox) -> None:
        """Publish reports in order; a batch is pipelined on one channel (order kept) and
        leaves the outbox only once every message of it is confirmed. A small batch lingers
        ``_LINGER_S`` first, so a trickle of reports travels in few messages."""
        while not self.closed.is_set():
            batch = await outbox.peek_batch(_OUTBOX_BATCH)
            if len(batch) < _LINGER_BELOW:
                await asyncio.sleep(_LINGER_S)
                batch = await outbox.peek_batch(_OUTBOX_BATCH)
            traces = _traces(batch)
            publishes = [
                self.publish(
                    topology.STATE_QUEUE,
                    topology.persistent(m.encode(), message_id=str(m.message_id), headers=_trace_headers(m, traces)),
                )
                for m in pack(batch)
            ]
            try:
                await asyncio.gather(*publishes)
            except Exception as e:  # noqa: BLE001
                self.fail(f"state publish failed: {e!r}")
                return
            outbox.drop_head(len(batch))


def _traces(batch: list[Report]) -> dict[uuid.UUID, tracing.Carrier]:
    """The trace context of each start report of ``batch`` that has one (none: traces off)."""
    if not tracing.active():
        return {}
    return {r.observer_id: r.trace for r in batch if isinstance(r, StartedReport) and r.trace is not None}


def _trace_headers(message: Message, traces: dict[uuid.UUID, tracing.Carrier]) -> dict[str, Any] | None:
    """A packed start report's headers: the context of each start it tells of (``tracing.report_headers``)."""
    if not traces or not isinstance(message, ObserversStarted):
        return None
    return tracing.report_headers([traces[oid] for oid in message.observer_ids if oid in traces])
