"""The manager's link to RabbitMQ: with ``manager/broker_probes.py`` (questions asked on
connections of their own), the only manager module that imports aio-pika.

Uses a robust connection: unlike a service, the manager holds no deliveries that stand
for running work, so re-consuming the state queue after a reconnect is exactly right.
While the broker is unreachable, publishes raise ``BrokerUnavailable`` (the API answers
503) and the connection is retried in the background (``manager/broker_reconnect.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar, cast

import aio_pika
import aiormq
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustChannel, AbstractRobustConnection
from aiormq import spec

from manager.broker_probes import BrokerProbes
from manager.broker_reconnect import RECONNECT_FIRST_S, Reconnects
from manager.settings import ManagerSettings
from shared import topology, tracing
from shared.amqp_errors import ConnectionCancelled, cancelled_calls_as_errors
from shared.batch_publish import BatchMessage, publish_batch
from shared.broker_nodes import BrokerNodes
from shared.errors import BrokerUnavailable
from shared.messages import Message, StartObserver
from shared.settings import amqp_url_with_heartbeat

logger = logging.getLogger(__name__)

T = TypeVar("T")

StateHandler = Callable[[AbstractIncomingMessage], Awaitable[None]]

_PUBLISH_TIMEOUT_S = 10.0
# A batch of starts gets this much more per message: a busy broker's confirms of several bulk
# creates outlast a flat deadline (figures: docs/design.md, "Where the time goes").
_PUBLISH_TIMEOUT_PER_MESSAGE_S = 0.01
# How long a publish waits for the broker to lift a block (connection.blocked: a memory or
# disk alarm) before the request is refused with a 503.
_BLOCKED_WAIT_S = 1.0


BLOCKED = "the broker blocks publishing (a memory or disk alarm: see its log)"


async def _may_publish(connection: aiormq.abc.AbstractConnection, wait_s: float) -> bool:
    """Whether the broker lets the connection publish (no ``connection.blocked`` in force),
    waiting up to ``wait_s`` for it to lift a block."""
    try:
        await asyncio.wait_for(connection.ready(), wait_s)
    except TimeoutError:
        return False
    return True


async def _unless_blocked(connection: aiormq.abc.AbstractConnection, work: Coroutine[Any, Any, T]) -> T:
    """``await work``, given up as soon as the broker blocks the connection: the broker tells
    a connection it is blocked only once it publishes, and the publish then waits for the
    alarm to clear, which may take minutes. Giving up is what a timeout does (some messages
    may have reached their queues)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_BLOCKED_WAIT_S)
            if done:
                return task.result()
            if not await _may_publish(connection, 0.05):
                raise BrokerUnavailable(BLOCKED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


class BrokerLink:
    def __init__(self, settings: ManagerSettings) -> None:
        self.settings = settings
        self._connection: AbstractRobustConnection | None = None
        self._pub: AbstractRobustChannel | None = None
        self._consuming: AbstractRobustChannel | None = None  # the state queue's, while consumed
        self._declared_pools: set[str] = set()
        # Start queues per pool that exist: ``ORCH_START_QUEUES``, or more where a larger
        # setting left them (the balancer asks: ``manager/balance/rounds.py``).
        self.start_queues_in_use = settings.start_queues
        self._declare_lock = asyncio.Lock()
        self._connect_task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        # Set at each reconnection, for the state side's background loop to check the
        # broker for lost data at once rather than at its next pass (``manager/repairs/loop.py``).
        self.reconnected = asyncio.Event()
        # Counts connections and reconnections: after each one the broker may be a new,
        # empty one (manager/repairs/rebuild.py checks the marker then).
        self.connects = 0
        self._marker_seen = 0  # ``connects`` when the rebuild marker was last seen
        # The node this link uses; the probes follow it (``shared/broker_nodes.py``).
        self.nodes = BrokerNodes(settings.broker_urls())
        # Liveness, the queue waker and the rebuild ask the broker on connections of their own.
        self.probes = BrokerProbes(settings, self.nodes)
        self.reconnects = Reconnects(self.nodes, settings.amqp_heartbeat_s, self._replace)
        self._on_state: StateHandler | None = None  # what the state queue's consumer calls, while consumed

    def start(self) -> None:
        """Connect in the background (retrying)."""
        self._connect_task = asyncio.create_task(self._connect_loop(), name="broker-connect")

    async def consume_state(self, on_state: StateHandler) -> None:
        """Consume the state queue (once connected), until :meth:`stop_consuming_state`; the
        robust channel consumes again after each reconnection."""
        await self.ready.wait()
        await self._consume_state(on_state)

    async def _consume_state(self, on_state: StateHandler) -> None:
        assert self._connection is not None
        channel = await self._connection.channel()
        try:
            await channel.set_qos(prefetch_count=self.settings.state_prefetch)
            state = await topology.declare_state_queue(channel, self.settings.queue_type)
            await state.consume(on_state)
        except BaseException:
            # Tried again by the caller: an attempt that failed half-way leaves no channel open.
            with contextlib.suppress(Exception):
                await channel.close()
            raise
        self._consuming, self._on_state = channel, on_state
        logger.info("consuming %s at %s", topology.STATE_QUEUE, self.nodes.describe())

    async def stop_consuming_state(self) -> None:
        """Close the state queue's channel: what it delivered and nobody acked goes back to
        the queue, for the next consumer."""
        channel, self._consuming, self._on_state = self._consuming, None, None
        if channel is not None:
            with contextlib.suppress(Exception):
                await channel.close()

    async def _connect_loop(self) -> None:
        while True:
            url = self.nodes.current
            try:
                connection = await aio_pika.connect_robust(
                    amqp_url_with_heartbeat(url, self.settings.amqp_heartbeat_s),
                    client_properties={"connection_name": "manager"},
                    reconnect_interval=RECONNECT_FIRST_S,
                )
                break
            except Exception as e:  # noqa: BLE001 - any failure: retry
                await asyncio.sleep(self.reconnects.connect_failed(url, e))
        self._connection = connection
        connection.reconnect_callbacks.add(self._on_reconnect)
        connection.close_callbacks.add(self._on_connection_lost)
        self.connects += 1
        self._pub = await connection.channel(publisher_confirms=True)
        await topology.declare_common(self._pub, self.settings.queue_type)
        # Declared by every manager: the state backlog is read by a passive declare.
        await topology.declare_state_queue(self._pub, self.settings.queue_type)
        if self._on_state is not None:  # a replaced connection's consumer
            await self._consume_state(self._on_state)
        if self.connects > 1:
            self._declared_pools.clear()
            self.reconnected.set()
        self.ready.set()
        self.reconnects.connected()

    async def _replace(self, old: AbstractRobustConnection) -> None:
        """A new connection instead of ``old``, whose reconnect loop stopped trying
        (``Reconnects``): the state queue is consumed again on it if it was."""
        old.close_callbacks.discard(self._on_connection_lost)
        old.reconnect_callbacks.discard(self._on_reconnect)
        self.ready.clear()
        self._connection, self._pub, self._consuming = None, None, None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(old.close(), 5)
        await self._connect_loop()

    def _on_reconnect(self, *_: object) -> None:
        self.reconnects.connected()
        self.connects += 1
        self._declared_pools.clear()  # a new broker may lack them
        self.reconnected.set()

    def _on_connection_lost(self, _connection: object, reason: BaseException | None = None) -> None:
        if self._connection is not None:
            self.reconnects.lost(self._connection, reason)

    async def checked(self) -> bool:
        """Whether the broker of this connection was checked for lost data (and rebuilt)."""
        try:
            await self._ensure_marker()
        except BrokerUnavailable:
            return False
        return True

    async def _ensure_marker(self) -> None:
        """Starts go only to a broker the state side has checked (once per connection): on
        a broker that lost its data they would be mixed up with the rebuild, which releases
        every observer from its service (``manager/repairs/rebuild.py``)."""
        if self._marker_seen == self.connects:
            return
        connects = self.connects
        if not await self.probes.marker_present():
            raise BrokerUnavailable(
                "the broker is new or lost its data and is being rebuilt from the database; retry in a few seconds"
            )
        self._marker_seen = connects

    async def close(self) -> None:
        self.reconnects.close()
        await self.probes.close()
        if self._connect_task is not None:
            self._connect_task.cancel()
            with contextlib.suppress(BaseException):
                await self._connect_task
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()

    def is_connected(self) -> bool:
        return self._connection is not None and self._connection.connected.is_set()

    async def _channel(self) -> AbstractRobustChannel:
        if self._pub is None or not self.is_connected():
            raise BrokerUnavailable("the broker is unreachable")
        return self._pub

    async def publish_starts(self, starts: Sequence[StartObserver], *, rebuilding: bool = False) -> None:
        """Publish persistent start messages to their pools' queues and wait until the broker
        confirmed every one (one deadline for the whole batch). Raises ``BrokerUnavailable``
        if any was not confirmed; some of the others may have been.

        Written as one batch on the underlying aiormq channel (``shared.batch_publish``): the
        per-message machinery of aio-pika's ``Exchange.publish`` and aiormq's
        ``basic_publish`` was most of a bulk create's time (figures: docs/benchmarks.md, "What
        the figures say"). ``mandatory``: a start for a queue that does not exist comes back
        as an error."""
        if not starts:
            return
        channel = await self._channel()
        if not rebuilding:
            await self._ensure_marker()
        deadline = _PUBLISH_TIMEOUT_S + _PUBLISH_TIMEOUT_PER_MESSAGE_S * len(starts)
        try:
            with cancelled_calls_as_errors():
                for pool in sorted({s.pool for s in starts}):
                    await self.declare_start_queues(pool)
                raw = await self._unblocked(channel)
                # One span per batch, child of the request's; every start carries its context.
                attributes = _publish_attributes(starts, self.start_queue(starts[0]))
                with tracing.producer_span("publish starts", attributes) as headers:
                    publish = publish_batch(
                        cast(aiormq.Channel, raw),
                        [
                            BatchMessage(
                                self.start_queue(start),
                                start.encode(),
                                topology.persistent_properties(str(start.message_id), headers),
                            )
                            for start in starts
                        ],
                        timeout=deadline,
                        mandatory=True,
                    )
                    results = await _unless_blocked(raw.connection, publish)
        except TimeoutError as e:
            raise BrokerUnavailable(
                f"the broker did not confirm {len(starts)} start message(s) within {deadline:g}s (overloaded?)"
            ) from e
        except Exception as e:
            raise BrokerUnavailable(f"{len(starts)} start message(s) not confirmed: {e!r}") from e
        refused = sum(1 for r in results if not isinstance(r, spec.Basic.Ack))
        if refused:
            raise BrokerUnavailable(f"the broker refused {refused} of {len(starts)} start message(s)")

    async def declare_start_queues(self, pool: str) -> None:
        """Declare ``pool``'s start queues, once per connection: many creates arrive at once.
        On a cluster each from a node of its own (``BrokerProbes.declare_start_queue_on_node``),
        so their leaders spread; before the services are told of them, so that no service
        declares one first from its own node."""
        if pool in self._declared_pools:
            return
        async with self._declare_lock:
            if pool in self._declared_pools:
                return
            spread = self.settings.queue_type == "quorum" and len(self.nodes.urls) > 1
            channel = await self._channel()
            for index in range(self.settings.start_queues):
                # Only a missing queue is declared from its node: a node unreachable (not
                # refusing: cut off) would hold every create of the pool for its connect.
                if (
                    spread
                    and not await self.probes.start_queue_exists(pool, index)
                    and await self.probes.declare_start_queue_on_node(pool, index)
                ):
                    continue
                await topology.declare_start_queue(channel, pool, self.settings.queue_type, index)
            self._declared_pools.add(pool)

    def start_queue(self, start: StartObserver) -> str:
        """The start queue ``start`` goes to (``topology.start_queue_index``)."""
        queues = self.settings.start_queues
        return topology.start_queue_name(start.pool, topology.start_queue_index(start.observer_id, queues))

    async def publish_control(self, message: Message) -> None:
        """Send a control command: to every service over the control fanout, or, when it
        names one (``service_id``), straight to that service's own control queue.

        In a failover, each observer moved while the manager still counts its dead service alive
        makes a stop aimed at that service (``observer_reports.started``); broadcast, every
        survivor would decode them all on its holding thread and throw them away (figures:
        docs/cost-curve.md). Sent to the target's queue, a command for a service that is gone
        (its exclusive queue with it) is dropped by the broker. Both routes go over this one
        channel, so the commands a service gets keep the order they were published in."""
        channel = await self._channel()
        raw = await self._unblocked(channel)
        target = getattr(message, "service_id", None)
        try:
            with cancelled_calls_as_errors():
                if target is None:
                    exchange = await channel.get_exchange(topology.CONTROL_EXCHANGE, ensure=False)
                    routing_key = ""
                else:
                    exchange = await channel.get_exchange(topology.CONTROL_DIRECT_EXCHANGE, ensure=False)
                    routing_key = str(target)
                publish = exchange.publish(
                    topology.persistent(message.encode(), message_id=str(message.message_id)),
                    routing_key=routing_key,
                    mandatory=False,
                    timeout=_PUBLISH_TIMEOUT_S,
                )
                await _unless_blocked(raw.connection, publish)
        except Exception as e:
            raise BrokerUnavailable(f"control message not confirmed: {e!r}") from e

    async def _unblocked(self, channel: AbstractRobustChannel) -> aiormq.abc.AbstractChannel:
        """The channel's aiormq channel, once its connection may publish. Under a memory or
        disk alarm the broker blocks publishing connections (``connection.blocked``); a
        publish then would wait for the alarm to clear, holding the request and its database
        work, so it is refused at once instead (the client is told to retry)."""
        try:
            with cancelled_calls_as_errors():
                raw = await channel.get_underlay_channel()
                may_publish = await _may_publish(raw.connection, _BLOCKED_WAIT_S)
        except ConnectionCancelled as e:
            raise BrokerUnavailable(str(e)) from e
        if not may_publish:
            raise BrokerUnavailable(BLOCKED)
        return raw

    async def start_backlog(self, pool: str) -> int | None:
        """Messages ready in a pool's start queues (together, those past ``ORCH_START_QUEUES``
        too), or None if unknown."""
        total = 0
        for index in range(max(self.settings.start_queues, self.start_queues_in_use)):
            count = await self._queue_backlog(pool, index)
            if count is None:
                return None
            total += count
        return total

    async def _queue_backlog(self, pool: str, index: int) -> int | None:
        """Messages ready in a pool's start queue ``index`` (declared if missing), or None if unknown.

        Asked on a channel of its own, passively: a declare with arguments fails on a queue an
        older release declared with others (this process may never have learned which: the
        state side declares nothing), and the error closes its channel, which was the one
        this process publishes on. A missing queue (the 404 closes that channel too) is
        declared on another, with this release's arguments: nothing can differ."""
        if self._connection is None or not self.is_connected():
            return None
        name = topology.start_queue_name(pool, index)
        try:
            with cancelled_calls_as_errors():
                try:
                    async with await self._connection.channel(publisher_confirms=False) as channel:
                        raw = await channel.get_underlay_channel()  # the robust channel caches counts
                        result = await raw.queue_declare(name, passive=True)
                except aiormq.exceptions.ChannelNotFoundEntity:
                    async with await self._connection.channel(publisher_confirms=False) as channel:
                        raw = await channel.get_underlay_channel()
                        arguments = topology.start_queue_arguments(pool, self.settings.queue_type, index)
                        result = await raw.queue_declare(name, durable=True, arguments=arguments)
        except Exception:  # noqa: BLE001
            return None
        return result.message_count

    async def state_backlog(self) -> int | None:
        """Messages ready in the state queue, or None if unknown."""
        try:
            with cancelled_calls_as_errors():
                channel = await self._channel()
                # On the raw channel: aio-pika's robust channel keeps the first declaration
                # result of a queue and would report a stale count.
                raw = await channel.get_underlay_channel()
                result = await raw.queue_declare(topology.STATE_QUEUE, passive=True)
        except Exception:  # noqa: BLE001
            return None
        return result.message_count


def _publish_attributes(starts: Sequence[StartObserver], queue: str) -> dict[str, str | int | bool]:
    """What a ``publish starts`` span says: the queue (of the first start) and how many."""
    return {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "publish",
        "messaging.destination.name": queue,
        "messaging.batch.message_count": len(starts),
    }
