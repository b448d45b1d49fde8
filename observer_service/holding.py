"""The holding connection, on a thread and event loop of its own.

What makes this service the owner of its observers lives here, and nothing bulky:
* the start channels: channels that consume the pools' start queues (manual ack, one consumer each,
  ``HOLD_PER_CHANNEL`` deliveries at most, together ``workers_count`` per pool), under the
  consumer priority or cordon the manager placed this service at (``start_consumers.py``);
* ``work``: this instance's exclusive control queue, whose presence tells the manager the
  connection lives (``manager/repairs/liveness.py``);
* ``lease``: the lease round trips. They travel on the connection that holds the
  deliveries: a round trip answered on it proves the broker has not given them away.

Why a thread: overload is not death (issue 17). On the observers' loop, a service with more
observer work than CPU sent its AMQP heartbeats and lease round trips late, and the broker
closed its connection as dead; on a thread of its own the interpreter hands it the GIL within its
switch interval however much work that loop has queued, so the lease stays valid and the
observers merely run late (figures: docs/design.md, "Pauses and the lease"). A frozen
process (SIGSTOP, swapped out) still freezes both threads, and the lease still lapses.

Every method here runs on the holding loop, except where it says "any thread". What crosses
to the main loop goes through its ``Mailbox``, in order: start deliveries, control
commands, and the session's failure. What comes back is settles (``settle_queue.py``) and
``LoopThread.call`` for opening, closing and handing starts back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import aio_pika
import aiormq
import aiormq.abc
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

from observer_service import metrics, queue_watch
from observer_service.lease import Lease, keep
from observer_service.loop_thread import Mailbox
from observer_service.settle_queue import DeliveryChannel, SettleQueue
from observer_service.start_channel import as_start_channel, takes_up_records
from observer_service.start_consumers import Placement, StartConsumers
from shared import topology
from shared.amqp_errors import describe_close, refusal
from shared.errors import DecodeError
from shared.messages import ControlMessage, decode_control

logger = logging.getLogger(__name__)

NOT_DECLARED_RETRY_S = 1.0  # a pool's start queue past the first, not declared by the manager yet

# A start delivery, as the runner keeps it: the body, its channel, the delivery tag, whether
# the broker redelivered it, and whether it came to a consumer stepped aside (every other one
# was full, or could not run it: ``start_consumers.py``), its AMQP headers (a trace's
# context, ``shared/tracing.py``; None without) and when this thread received it
# (``time.monotonic``). Called on the main loop.
StartHandler = Callable[[bytes, DeliveryChannel, int, bool, bool, Mapping[str, Any] | None, float], None]
# A decoded control command (already acked), called on the main loop.
ControlHandler = Callable[[ControlMessage], None]
# Called (on any thread) when the connection is gone: the reason and the error, if any.
FailHandler = Callable[[str, BaseException | None], None]
# Called on the main loop with a pool and what the broker refuses about its start queue (in
# a line naming what to change), or None once it consumes that pool.
RefusedHandler = Callable[[str, str | None], None]


class HoldingConnection:
    def __init__(
        self,
        lease: Lease,
        heartbeat_s: int,
        to_main: Mailbox,
        fail: FailHandler,
        queue_type: topology.QueueType = "classic",
        give_up_s: float = 15.0,
        placement: Placement | None = None,
        refused_retry_s: float = 30.0,
    ) -> None:
        self.lease = lease
        self._heartbeat_s = heartbeat_s
        # On a cluster (quorum queues) the lease is a write a majority confirms, and a lease
        # unrenewed for ``give_up_s`` ends the session (docs/design.md, "On a RabbitMQ cluster").
        self._queue_type = queue_type
        self._quorum = queue_type == "quorum"
        # Four round trips a lease on a cluster, where it is short (1 s), two on one node (H/4).
        self._period = lease.validity_s / (4 if self._quorum else 2)
        self._give_up_s = give_up_s
        self._refused_retry_s = refused_retry_s
        self._to_main = to_main
        self._fail = fail
        self._connection: AbstractConnection | None = None
        self._lease_channel: AbstractChannel | None = None
        self.starts = StartConsumers(self._quorum, placement or Placement())
        self._on_start: StartHandler | None = None
        self._on_control: ControlHandler | None = None
        self._on_refused: RefusedHandler | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._handing_back: set[asyncio.Task[None]] = set()
        self._closing = False
        self.settles = SettleQueue(self.starts.settled)  # posted by the main loop
        self._holds: dict[str, list[int]] = {}  # pool -> the prefetch of each channel per queue
        self._refused: dict[str, dict[str, str]] = {}  # pool -> its queues refused, and why
        # pool -> the indexes of its start queues consumed, or to be once declared or allowed
        self._indexes: dict[str, set[int]] = {}
        # The start queues' markers (``queue_watch.py``), once open; what they left after the
        # close (or, not opened, what earlier sessions left), for the service's next session.
        self._markers: queue_watch.Markers | None = None
        self.markers_left: list[tuple[str, str]] = []

    async def open(
        self,
        url: str,
        name: str,
        on_start: StartHandler,
        on_control: ControlHandler,
        service_id: uuid.UUID,
        holds: list[tuple[str, list[int]]],
        on_refused: RefusedHandler,
        session_id: uuid.UUID | None = None,
        markers_left: list[tuple[str, str]] | None = None,
    ) -> None:
        """Connect, take the lease, declare the control queue and consume each pool's start
        queue on channels of the given prefetches (``holds``: pool, prefetch per channel);
        delete ``markers_left`` by earlier sessions."""
        self._on_start, self._on_control, self._on_refused = on_start, on_control, on_refused
        self.markers_left = list(markers_left or ())
        self._connection = await aio_pika.connect(url, client_properties={"connection_name": name})
        self._connection.close_callbacks.add(self._on_closed)
        self._markers = queue_watch.Markers(self._connection, (session_id or uuid.uuid4()).hex, self.markers_left)
        self._lease_channel = await self._channel(confirms=self._quorum)
        if self._quorum:
            await topology.declare_lease_queue(self._lease_channel)
            # On a node cut off from the others this publish is never confirmed: bounded, the
            # session fails and the next attempt goes to the next node.
            try:
                await asyncio.wait_for(self._renew_lease(), self._give_up_s)
            except TimeoutError:
                raise ConnectionError(
                    f"no majority of the cluster confirmed the lease within {self._give_up_s:.0f}s "
                    "(this node is cut off from the others)"
                ) from None
        else:
            await self._renew_lease()
        work = await self._channel()
        control = await self._declare_control_queue(work, service_id, session_id)
        self._watch_cancels(await work.get_underlay_channel(), control.name)
        await control.consume(self._on_control_message)
        self._holds = dict(holds)
        for pool, prefetches in holds:
            for index in range(self.starts.placement.start_queues):
                await self._hold_queue(pool, index, prefetches)
        self._tasks += [
            asyncio.create_task(self._lease_loop(), name="lease"),
            asyncio.create_task(self.settles.run(), name="settle"),
            asyncio.create_task(self._watch_queues(), name="watch queues"),
        ]
        if self.markers_left:
            self._spawn(self._markers.forget_left(), "delete earlier sessions' markers")

    async def _declare_control_queue(
        self, work: AbstractChannel, service_id: uuid.UUID, session_id: uuid.UUID | None
    ) -> AbstractQueue:
        """The service's control queue, or, when its previous session's node went down with
        it (a cluster keeps an exclusive queue until its node returns: RESOURCE_LOCKED), one
        named after this session. Tried on a channel of its own: the refusal closes it."""
        assert self._connection is not None
        trial = await self._connection.channel(publisher_confirms=False)
        try:
            await topology.declare_control_queue(trial, service_id)
        except aiormq.exceptions.ChannelLockedResource:
            if session_id is None:
                raise
            logger.warning(
                "the control queue of this service's previous session is still held by a node that is down: "
                "this session uses one of its own"
            )
            return await topology.declare_control_queue(work, service_id, session_id)
        with contextlib.suppress(Exception):
            await trial.close()
        # Declared and bound by this connection: consumed on ``work`` without declaring again.
        return await work.get_queue(topology.control_queue_name(service_id), ensure=False)

    async def _channel(self, *, confirms: bool = False) -> AbstractChannel:
        assert self._connection is not None
        channel = await self._connection.channel(publisher_confirms=confirms, on_return_raises=confirms)
        channel.close_callbacks.add(self._on_closed)
        return channel

    def _on_closed(self, _sender: Any, exc: BaseException | None) -> None:
        if not self._closing:
            self._fail(describe_close(exc, self._heartbeat_s), exc)

    async def close(self) -> None:
        self._closing = True
        # Settles posted before the close still go out if the connection lives: each was
        # posted only once its report was confirmed, so it is owed to the broker.
        if self._connection is not None and not self._connection.is_closed:
            await self.settles.send()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        if self._markers is not None:
            self.markers_left = await self._markers.close()
        if self._connection is not None and not self._connection.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._connection.close(), 5)

    async def place(self, placement: Placement) -> None:
        """Consume under ``placement``: a pool's start queues it names that are not consumed
        yet are asked for (the first declared) and consumed first. Told fewer than it consumes,
        it stops consuming each queue past them from which it holds nothing (the manager tells
        fewer only once they are empty, to delete them: ``manager/balance/retire.py``); one it
        still holds starts from stays consumed, and its starts are moved (``retire.py``)."""
        await self.starts.place(placement)
        for pool, prefetches in self._holds.items():
            for index in range(placement.start_queues):
                if index not in self._indexes.get(pool, set()):
                    await self._hold_queue(pool, index, prefetches)
            for index in sorted(self._indexes.get(pool, set())):
                if index >= placement.start_queues:
                    await self._let_go(pool, index)

    async def _let_go(self, pool: str, index: int) -> None:
        """Stop consuming the pool's start queue ``index`` if this session holds nothing from it."""
        queue = topology.start_queue_name(pool, index)
        channels = await self.starts.release(pool, queue)
        if channels is None:
            return
        self._indexes[pool].discard(index)
        for channel in channels:
            channel.close_callbacks.discard(self._on_closed)  # the session lives on
            with contextlib.suppress(Exception):
                await channel.close()
        if self._markers is not None:
            await self._markers.unmark(queue)
        logger.info("no longer consuming %s: past the start queues the manager keeps", queue)

    async def _hold_queue(self, pool: str, index: int, prefetches: list[int]) -> None:
        """Declare the pool's start queue ``index`` and consume it. A declare the broker refuses
        for good (the queue exists with other arguments, a policy or version rejects them, no
        permission) costs only its own channel: the session stays open for the other queues
        and the control queue, the main loop is told (``RefusedHandler``, so the operator is,
        and the manager through the heartbeats), and the declare is tried again every
        ``refused_retry_s`` until whatever was wrong is fixed. Any other failure fails the
        open.

        The second queue on is only asked for: the manager declares each from a node of its
        own, so that their leaders spread, before it publishes to it (a service declaring it
        first would put its leader on the service's node). One not declared yet holds no
        start; it is asked for again every ``NOT_DECLARED_RETRY_S``."""
        assert self._connection is not None and self._on_refused is not None
        name = topology.start_queue_name(pool, index)
        refused = self._refused.setdefault(pool, {})
        self._indexes.setdefault(pool, set()).add(index)
        declare = await self._connection.channel(publisher_confirms=False)  # a refusal closes it alone
        try:
            if index:
                queue = await declare.declare_queue(name, passive=True)
            else:
                queue = await topology.declare_start_queue(declare, pool, self._queue_type)
        except aiormq.exceptions.ChannelNotFoundEntity:
            if not index:
                raise
            self._spawn(self._hold_later(pool, index, prefetches, NOT_DECLARED_RETRY_S), f"ask again for {name}")
            return
        except aiormq.exceptions.AMQPChannelError as e:
            hint = refusal(e)
            if hint is None:
                raise
            refused[name] = hint
            self._to_main.post(self._on_refused, pool, hint)
            self._spawn(self._hold_later(pool, index, prefetches, self._refused_retry_s), f"refused {name}")
            return
        with contextlib.suppress(Exception):
            await declare.close()
        for prefetch in prefetches:
            await self._hold_on_new_channel(pool, queue.name, index, prefetch, sum(prefetches))
        if self._markers is not None:  # after the consume, not to delay it
            self._spawn(self._markers.mark(queue.name), f"mark {name}")
        refused.pop(name, None)
        self._to_main.post(self._on_refused, pool, next(iter(refused.values()), None))

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``work`` beside the session, cancelled at its close; the finished ones are
        let go (a queue not declared yet is asked for again every second), a failed one is
        kept for the close to collect."""
        self._tasks = [t for t in self._tasks if not (t.done() and (t.cancelled() or t.exception() is None))]
        self._tasks.append(asyncio.create_task(work, name=name))

    async def _hold_later(self, pool: str, index: int, prefetches: list[int], after_s: float) -> None:
        await asyncio.sleep(after_s)
        if index >= self.starts.placement.start_queues:
            self._indexes[pool].discard(index)  # no longer asked for (deleted, past the setting)
            return
        try:
            await self._hold_queue(pool, index, prefetches)
        except Exception as e:  # noqa: BLE001 - the session is broken: end it like any loss
            self._fail(f"consuming pool {pool} failed: {e!r}", e)

    async def _hold_on_new_channel(self, pool: str, queue: str, index: int, prefetch: int, workers: int) -> None:
        channel = await self._channel()
        raw = as_start_channel(await channel.get_underlay_channel(), self._on_start_delivery)
        self._watch_cancels(raw, queue, pool)
        # Sets the prefetch, and the tag on a quorum queue: start_consumers.py
        records = takes_up_records(raw)
        await self.starts.hold(channel, raw, pool, queue, prefetch, workers, index=index, takes_up_records=records)

    def _watch_cancels(self, channel: aiormq.abc.AbstractChannel, queue: str, pool: str | None = None) -> None:
        """A consumer the broker cancels (its queue deleted, the queue's node gone, a quorum
        queue's consumer timeout) ends the session. The broker has already given its
        deliveries back, or lost them with the queue, so the observers they started are no
        longer this service's to run: the session's end fences them at once, and the next
        session declares the queues again and consumes. Ending the whole session costs a
        move of the other observers too, but keeps one rule for every loss of a lease:
        deliveries belong to a session, and a session is whole or gone. For a start queue,
        whether the queue was deleted is asked beside (``queue_watch.py``): the service
        waits for the answer (``deleted_pools``) after the fence, before its next session."""

        def cancelled(frame: aiormq.spec.Basic.Cancel) -> None:
            if self._closing:
                return
            if pool is not None and self._markers is not None:
                self._markers.cancelled(pool, queue)
            why = "the queue was deleted, its node went down, or a quorum queue's consumer timeout fired"
            self._fail(f"the broker cancelled the consumer of {queue} (consumer tag {frame.consumer_tag}): {why}", None)

        channel.on_consumer_cancel_callbacks.add(cancelled)

    async def deleted_pools(self) -> set[str]:
        """The pools whose start queue was deleted while this session held starts from it,
        once every cancelled consumer's queue has been judged (``queue_watch.Markers``)."""
        return set() if self._markers is None else await self._markers.deleted_pools()

    @property
    def gone_pools(self) -> set[str]:
        """The pools judged so far (any thread)."""
        return set() if self._markers is None else set(self._markers.gone_pools)

    async def _watch_queues(self) -> None:
        """While the start queues are not consumed (cordoned), no cancel says one was deleted:
        ``queue_watch.while_cordoned`` asks, and a deletion ends the session."""
        assert self._markers is not None
        markers = self._markers

        def queues() -> list[tuple[str, str]]:
            return [
                (pool, queue)
                for pool in self._holds
                for queue in self.starts.queues(pool) or [topology.start_queue_name(pool)]
            ]

        def gone(pool: str, queue: str) -> None:
            markers.gone_pools.add(pool)
            self._fail(f"the start queue {queue} was deleted while this service consumed nothing", None)

        def closing() -> bool:
            return self._closing

        await queue_watch.while_cordoned(markers, closing, self.starts.consuming, queues, gone)

    async def requeue_held(self) -> None:
        """Close the start channels (``Session.requeue_held`` says why), after sending every settle
        posted before: an ack of a stopped observer must not be turned into a requeue."""
        await self.settles.send()

        def on_purpose(channel: AbstractChannel) -> None:
            channel.close_callbacks.discard(self._on_closed)  # the session lives on

        await self.starts.close_channels(on_purpose)

    # --- deliveries and commands: to the main loop ---------------------------------------

    def _on_start_delivery(self, message: aiormq.abc.DeliveredMessage) -> None:
        """The start channels' delivery handler, called on their reader (``StartChannel``). Start
        deliveries are taken on the raw channel, not as aio-pika messages: a service keeps
        every start it runs for the observer's whole life, and aio-pika's message would be a
        large share of what a held observer costs (docs/design.md, "What grows with the
        fleet", density). What is kept is the body and the tag; settling goes by tag."""
        delivery = message.delivery
        assert isinstance(delivery, aiormq.spec.Basic.Deliver) and self._on_start is not None
        tag = delivery.delivery_tag or 0
        arrival = self.starts.delivered(message.channel, tag)
        if arrival == "excess":
            task = asyncio.create_task(self._hand_back_excess(message.channel, tag))
            self._handing_back.add(task)  # a close needs none of them: the broker requeues
            task.add_done_callback(self._handing_back.discard)
            return
        headers = message.header.properties.headers
        redelivered = bool(delivery.redelivered)
        received_at = time.monotonic()
        aside = arrival == "aside"
        self._to_main.post(self._on_start, message.body, message.channel, tag, redelivered, aside, headers, received_at)

    async def _hand_back_excess(self, channel: DeliveryChannel, tag: int) -> None:
        """A start past the pool's workers (several start queues delivered at once): never
        run, handed back once the pool's consumers are cancelled, so it goes to a service
        with room (``StartConsumers.pause``)."""
        metrics.STARTS_PAST_WORKERS.inc()
        with contextlib.suppress(Exception):
            await self.starts.pause(channel)
        self.settles.post("requeue", channel, tag)

    async def _on_control_message(self, message: AbstractIncomingMessage) -> None:
        """Decoded here, acked here (a malformed one is dead-lettered, and the consumer goes
        on), then handed to the main loop."""
        try:
            command = decode_control(message.body)
        except DecodeError as e:
            logger.error("dead-lettering a malformed control message: %s", e)
            with contextlib.suppress(Exception):
                await message.reject(requeue=False)
            return
        with contextlib.suppress(Exception):
            await message.ack()
        assert self._on_control is not None
        self._to_main.post(self._on_control, command)

    # --- lease -------------------------------------------------------------------------

    async def _renew_lease(self) -> None:
        assert self._lease_channel is not None
        sent_at = time.monotonic()
        if self._quorum:
            # Confirmed only once a majority of the nodes has it: a node cut off from the
            # others answers a passive declare, never this.
            await self._lease_channel.default_exchange.publish(
                aio_pika.Message(b""), routing_key=topology.LEASE_QUEUE, mandatory=True
            )
        else:
            # Any synchronous method is a round trip; a passive declare is the cheapest.
            await self._lease_channel.declare_exchange(topology.EVENTS_EXCHANGE, passive=True)
        self.lease.renew(sent_at)
        metrics.LEASE_ROUND_TRIP.observe(time.monotonic() - sent_at)

    async def _lease_loop(self) -> None:
        """Renew every ``_period`` (``lease.keep`` says why a slow round trip ends nothing); on
        a cluster a lease unrenewed for ``give_up_s`` ends the session."""
        give_up_s = self._give_up_s if self._quorum else None
        await keep(self.lease, self._renew_lease, self._period, give_up_s, self._fail)
