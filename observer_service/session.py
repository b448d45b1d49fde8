"""One broker session: the only module of the service that touches aio-pika (and aiormq under it).

A session is two AMQP connections, so that liveness never waits behind bulk traffic:
* ``hold`` — what makes this host the owner of its observers, and nothing bulky:
  - the holders: channels that consume the pools' start queues (manual ack, one consumer
    each, ``HOLD_PER_CHANNEL`` deliveries at most, together ``workers_count`` per pool);
  - ``work``: this instance's exclusive control queue, whose presence tells the manager the
    connection lives (``manager/liveness.py``);
  - ``lease``: the lease round trips. They must travel on the connection that holds the
    deliveries: a round trip answered on it proves the broker has not given them away.
* ``publish`` — publisher confirms; state reports, inventories and observer events (batched
  by ``emits.EventPublisher``, which writes on this connection's channel too). RabbitMQ
  throttles a connection that publishes faster than it can route (credit flow) and blocks it
  under a memory or disk alarm: on a connection of its own that throttling delays reports
  and emits, never the lease (issue 17: 5,000 events/s starved the lease round trips that
  shared their channel, and every service dropped its session).

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
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import aiormq
import aiormq.abc
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from observer_service import metrics
from observer_service.emits import EventPublisher
from observer_service.lease import Lease
from observer_service.outbox import Outbox, pack
from shared import topology
from shared.errors import BrokerUnavailable, LeaseLost
from shared.settings import ServiceSettings, amqp_url_with_heartbeat

logger = logging.getLogger(__name__)

Handler = Callable[[AbstractIncomingMessage], Awaitable[None]]
# The channel a start delivery came on: settling it needs that channel and the delivery tag.
Holder = aiormq.abc.AbstractChannel
# A start delivery, as the runner keeps it: the body, its holder, the delivery tag and whether
# the broker redelivered it.
StartHandler = Callable[[bytes, Holder, int, bool], None]

ACK_TIMEOUT_HINT = (
    "the broker closed the channel because a delivery stayed unacked longer than its "
    "consumer_timeout: observers hold their start message for their whole life, so lift it "
    "(advanced.config: [{rabbit,[{consumer_timeout, undefined}]}]. — shipped in deploy/rabbitmq/)"
)

_OUTBOX_BATCH = 5_000  # reports taken per round; packed into far fewer messages
# Reports that trickle in (a burst of deliveries arrives a few at a time) wait this long for
# company before they are published: a bulk create of 30,000 made 2,631 state messages of
# ~11 reports each, and every message costs the broker, the manager and this service.
_LINGER_S = 0.02
_LINGER_BELOW = 500
MAX_PREFETCH = 65_535  # prefetch_count is a 16-bit field
# Starts held per channel. RabbitMQ finds the delivery an ack, nack or reject names by walking
# its channel's unacked deliveries from the oldest (rabbit_channel:collect_acks), so settling
# one costs time proportional to how many that channel holds: a stop of 30,000 of 300,000,
# on channels of up to 65,535 each, took minutes (make bench-scale). Held on channels of
# this many, each settle walks at most this far; a channel costs the broker one process.
HOLD_PER_CHANNEL = 4_096


def prefetch_chunks(workers_count: int, per_consumer: int = MAX_PREFETCH) -> list[int]:
    """Prefetch of each consumer so that together they hold ``workers_count`` deliveries."""
    full, rest = divmod(workers_count, min(per_consumer, MAX_PREFETCH))
    return [min(per_consumer, MAX_PREFETCH)] * full + ([rest] if rest else [])


class Session:
    def __init__(self, settings: ServiceSettings, service_id: uuid.UUID, lease: Lease) -> None:
        self.settings = settings
        self.service_id = service_id
        # Named in start reports and inventories; a stop aimed at one copy carries it.
        self.id = uuid.uuid4()
        self.lease = lease
        self.closed = asyncio.Event()
        self.close_reason = ""
        self._hold: AbstractConnection | None = None
        self._publish: AbstractConnection | None = None
        self._work: AbstractChannel | None = None
        # The channels that hold start deliveries, one consumer each (``HOLD_PER_CHANNEL``);
        # deliveries are consumed and settled on the raw aiormq channel under each.
        self._holders: list[tuple[AbstractChannel, Holder]] = []
        self._held_back = False  # ``requeue_held`` closed them on purpose
        self._lease: AbstractChannel | None = None
        self._pub: AbstractChannel | None = None
        self._events: EventPublisher | None = None
        # Emits in flight at once: past it an observer's emit waits (issue 17).
        self._emit_slots = asyncio.Semaphore(settings.emits_in_flight)
        self._start_consumers: list[tuple[Holder, str]] = []
        self._on_start: StartHandler | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -------------------------------------------------------------------

    async def open(self, on_start: StartHandler, on_control: Handler, outbox: Outbox) -> None:
        url = amqp_url_with_heartbeat(self.settings.amqp_url, self.settings.amqp_heartbeat_s)
        name = f"observer-service {self.settings.service_name}"
        try:
            self._publish = await self._connect(url, f"{name} (publish)")
            self._pub = await self._publish.channel(publisher_confirms=True)
            self._pub.close_callbacks.add(self._on_closed)
            await topology.declare_common(self._pub)
            self._events = EventPublisher(await self._pub.get_underlay_channel(), self.lease, self.fail)
            self._hold = await self._connect(url, name)
            self._lease = await self._hold.channel(publisher_confirms=False)
            self._lease.close_callbacks.add(self._on_closed)
            await self._renew_lease()
            self._work = await self._hold.channel(publisher_confirms=False)
            self._work.close_callbacks.add(self._on_closed)
            control = await topology.declare_control_queue(self._work, self.service_id)
            await control.consume(on_control)
            self._on_start = on_start
            for pool in self.settings.pools:
                queue = await topology.declare_start_queue(self._work, pool)
                for prefetch in prefetch_chunks(self.settings.workers_count, HOLD_PER_CHANNEL):
                    await self._hold_on_new_channel(queue.name, prefetch)
        except Exception as e:
            await self.close(f"open failed: {e!r}")
            raise BrokerUnavailable(f"cannot open a broker session: {e!r}") from e
        self._tasks = [
            asyncio.create_task(self._lease_loop(), name="lease"),
            asyncio.create_task(self._outbox_loop(outbox), name="outbox"),
        ]
        logger.info("broker session open (pools=%s, prefetch=%d)", self.settings.pools, self.settings.workers_count)

    async def _connect(self, url: str, name: str) -> AbstractConnection:
        connection = await aio_pika.connect(url, client_properties={"connection_name": name})
        connection.close_callbacks.add(self._on_closed)
        return connection

    def _on_closed(self, _sender: Any, exc: BaseException | None) -> None:
        self.fail(f"closed by broker or network: {exc!r}", exc)

    def fail(self, reason: str, exc: BaseException | None = None, *, expected: bool = False) -> None:
        """Mark the session dead. Safe to call many times and from callbacks."""
        if self.closed.is_set():
            return
        self.lease.revoke()
        self.close_reason = reason
        if exc is not None and "acknowledgement" in str(exc) and "timed out" in str(exc):
            logger.error("%s (%s)", ACK_TIMEOUT_HINT, exc)
        elif expected:
            logger.info("broker session closed: %s", reason)
        else:
            logger.warning("broker session lost: %s", reason)
        if not expected:
            metrics.SESSIONS_LOST.inc()
        self.closed.set()

    async def close(self, reason: str = "closing") -> None:
        self.fail(reason, expected=True)
        if self._events is not None:
            await self._events.close(self.close_reason or reason)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        for connection in (self._hold, self._publish):
            if connection is not None and not connection.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), 5)

    async def _hold_on_new_channel(self, queue: str, prefetch: int) -> None:
        assert self._hold is not None
        channel = await self._hold.channel(publisher_confirms=False)
        channel.close_callbacks.add(self._on_closed)
        raw = await channel.get_underlay_channel()
        self._holders.append((channel, raw))
        await channel.set_qos(prefetch_count=prefetch)
        ok = await raw.basic_consume(
            queue, self._on_start_delivery, arguments={"x-consumer-timeout": topology.START_CONSUMER_TIMEOUT_MS}
        )
        assert ok.consumer_tag is not None
        self._start_consumers.append((raw, ok.consumer_tag))

    async def stop_consuming(self) -> None:
        """Cancel the start consumers: no new observers, the held deliveries stay ours."""
        for raw, tag in self._start_consumers:
            with contextlib.suppress(Exception):
                await raw.basic_cancel(tag)
        self._start_consumers.clear()

    # --- start deliveries ----------------------------------------------------------------

    async def _on_start_delivery(self, message: aiormq.abc.DeliveredMessage) -> None:
        """aiormq's consumer callback. Start deliveries are taken on the raw channel, not as
        aio-pika messages: a service keeps every start it runs for the observer's whole life,
        and aio-pika's message with aiormq's frames is ~1.3 KiB of it (issue 17, density).
        What is kept is the body and the tag; settling goes by tag (``ack``...)."""
        delivery = message.delivery
        assert isinstance(delivery, aiormq.spec.Basic.Deliver) and self._on_start is not None
        self._on_start(message.body, message.channel, delivery.delivery_tag or 0, bool(delivery.redelivered))

    async def ack(self, holder: Holder, tag: int) -> None:
        """Settle a start delivery of this session: the observer is given away (stopped)."""
        await self._holding(holder).basic_ack(tag)

    async def requeue(self, holder: Holder, tag: int) -> None:
        """Hand a start back to the queue, for any service of the pool to take."""
        await self._holding(holder).basic_nack(tag, requeue=True)

    async def reject(self, holder: Holder, tag: int) -> None:
        """Dead-letter a start (to the pool's error queue): never run again."""
        await self._holding(holder).basic_reject(tag, requeue=False)

    def _holding(self, holder: Holder) -> Holder:
        # Once its channel is closed (a dead session, or ``requeue_held``) a delivery is the
        # broker's again: settling it is an error (``settle`` ignores it).
        if self._held_back or holder.is_closed:
            raise BrokerUnavailable("the channel of this delivery is closed: it went back to the queue")
        return holder

    async def requeue_held(self) -> None:
        """Give every held delivery back to the broker at once, by closing the channels that
        hold them: the broker requeues a closed channel's unacked deliveries as one batch.
        Nacking them one by one costs RabbitMQ time that grows faster than their number (each
        nack walks the channel's unacked deliveries: see ``HOLD_PER_CHANNEL``): 5,000 nacks
        on one channel took 2.6 s of broker CPU, 10,000 took 14 s and 20,000 took 22 to 81 s
        in three runs, against at most 0.06 s for a close (``python -m bench.requeue``), and
        the queue serves nobody meanwhile. The rest of the session (the lease, the outbox, the
        control queue) stays open."""
        self._held_back = True
        holders, self._holders = self._holders, []
        for channel, _ in holders:
            channel.close_callbacks.discard(self._on_closed)  # closed on purpose: the session lives on
        for channel, _ in holders:
            with contextlib.suppress(Exception):
                await channel.close()

    # --- lease -------------------------------------------------------------------------

    async def _renew_lease(self) -> None:
        assert self._lease is not None
        sent_at = time.monotonic()
        # Any synchronous method is a round trip; a passive declare is the cheapest.
        await self._lease.declare_exchange(topology.EVENTS_EXCHANGE, passive=True)
        self.lease.renew(sent_at)
        metrics.LEASE_ROUND_TRIP.observe(time.monotonic() - sent_at)

    async def _lease_loop(self) -> None:
        """Renew every H/4. A slow round trip is waited for, however long, never cancelled
        (aiormq closes the channel of a cancelled RPC) and never taken for a dead broker.

        A lapsed lease pauses the observers (``ensure_lease`` refuses) but does not end the
        session: a round trip that completes later on this same connection proves the broker
        never declared it dead (it would have closed it), so nothing was given to anyone else
        and the observers may go on. What ends a session is evidence that the connection is
        gone: the broker closing it, the socket, or aiormq's heartbeat check (no frame at all
        from the broker for 3 x (H + 1) s), each of which closes the connection and calls
        ``_on_closed``. Giving up on a round trip unanswered for H instead ended every
        session of a fleet whose broker was merely busy (issue 17: 300,000 observers emitting
        once a minute), and the requeues made the broker busier still."""
        period = self.settings.amqp_heartbeat_s / 4
        renewal: asyncio.Task[None] | None = None
        lapsed = False
        while not self.closed.is_set():
            if renewal is None or renewal.done():
                if renewal is not None and renewal.exception() is not None:
                    self.fail(f"lease round trip failed: {renewal.exception()!r}")
                    return
                renewal = asyncio.create_task(self._renew_lease())
            await asyncio.wait({renewal}, timeout=period)
            if self.lease.is_valid() == lapsed:
                lapsed = not lapsed
                if lapsed:
                    logger.warning("lease lapsed (starved or slow broker): observers paused until it is renewed")
                else:
                    logger.info("lease renewed: observers resume")
            await asyncio.sleep(max(0.0, period - (time.monotonic() - (self.lease.renewed_at or 0))))

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
        if self._emit_slots.locked():
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
            publishes = [
                self.publish(topology.STATE_QUEUE, topology.persistent(m.encode(), message_id=str(m.message_id)))
                for m in pack(batch)
            ]
            try:
                await asyncio.gather(*publishes)
            except Exception as e:  # noqa: BLE001
                self.fail(f"state publish failed: {e!r}")
                return
            outbox.drop_head(len(batch))
