"""The manager's link to RabbitMQ: with ``manager/broker_probes.py`` (questions asked on
connections of their own), the only manager module that imports aio-pika.

Uses a robust connection: unlike a service, the manager holds no deliveries that stand
for running work, so re-consuming the state queue after a reconnect is exactly right.
While the broker is unreachable, publishes raise ``BrokerUnavailable`` (the API answers
503) and the connection is retried in the background.
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
from yarl import URL

from manager.broker_probes import BrokerProbes
from shared import topology
from shared.amqp_errors import (
    ConnectionCancelled,
    cancelled_calls_as_errors,
    describe_close,
    describe_connect_failure,
    vhost_refused,
    vhost_refused_text,
)
from shared.backoff import backoff_delay
from shared.batch_publish import BatchMessage, publish_batch
from shared.broker_nodes import BrokerNodes, node_name
from shared.errors import BrokerUnavailable
from shared.logs import last_chatter
from shared.messages import Message, StartObserver
from shared.settings import ManagerSettings, amqp_url_with_heartbeat

logger = logging.getLogger(__name__)

T = TypeVar("T")

StateHandler = Callable[[AbstractIncomingMessage], Awaitable[None]]

_PUBLISH_TIMEOUT_S = 10.0
# A batch of starts gets this much more per message: a busy broker's confirms of several bulk
# creates outlast a flat deadline (figures: docs/design.md, "Where the time goes").
_PUBLISH_TIMEOUT_PER_MESSAGE_S = 0.01
# The interval between attempts to reconnect a lost connection (``BrokerLink._pace_reconnects``).
_RECONNECT_FIRST_S = 0.2
_RECONNECT_MAX_S = 5.0
# While the broker stays unreachable, a line says so this often.
_STILL_DOWN_EVERY_S = 60.0
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


def reconnect_interval(attempts: int, spread: float | None = None) -> float:
    """Seconds until the next attempt to reconnect, after ``attempts`` failed ones: the
    services' backoff (``shared.backoff``) from ``_RECONNECT_FIRST_S`` to ``_RECONNECT_MAX_S``,
    to a hundredth (aio-pika's log line for each attempt prints it as it is)."""
    return round(backoff_delay(attempts, _RECONNECT_FIRST_S, _RECONNECT_MAX_S, spread), 2)


def _reason(exc: BaseException | None, heartbeat_s: int) -> str:
    """Why a connection closed, in a line: the broker's reply (``CONNECTION_FORCED - ...``),
    the socket's error, or no frame for the heartbeat's grace (``describe_close``)."""
    if exc is None:
        return "no reason given"
    if isinstance(exc, asyncio.CancelledError):
        return describe_close(exc, heartbeat_s)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class BrokerLink:
    def __init__(self, settings: ManagerSettings) -> None:
        self.settings = settings
        self._connection: AbstractRobustConnection | None = None
        self._pub: AbstractRobustChannel | None = None
        self._consuming: AbstractRobustChannel | None = None  # the state queue's, while consumed
        self._declared_pools: set[str] = set()
        self._declare_lock = asyncio.Lock()
        self._connect_task: asyncio.Task[None] | None = None
        self._pacing: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        # Set at each reconnection, for the state side's background loop to check the
        # broker for lost data at once rather than at its next pass (``manager/repairs/loop.py``).
        self.reconnected = asyncio.Event()
        # Counts connections and reconnections: after each one the broker may be a new,
        # empty one (manager/repairs/rebuild.py checks the marker then).
        self.connects = 0
        self._marker_seen = 0  # ``connects`` when the rebuild marker was last seen
        self._lost_at: float | None = None  # loop time the connection was lost, None while up
        # The node this link uses; the probes follow it (``shared/broker_nodes.py``).
        self.nodes = BrokerNodes(settings.broker_urls())
        # Liveness, the queue waker and the rebuild ask the broker on connections of their own.
        self.probes = BrokerProbes(settings, self.nodes)

    def start(self) -> None:
        """Connect in the background (retrying)."""
        self._connect_task = asyncio.create_task(self._connect_loop(), name="broker-connect")

    async def consume_state(self, on_state: StateHandler) -> None:
        """Consume the state queue (once connected), until :meth:`stop_consuming_state`; the
        robust channel consumes again after each reconnection."""
        await self.ready.wait()
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
        self._consuming = channel
        logger.info("consuming %s at %s", topology.STATE_QUEUE, self.nodes.describe())

    async def stop_consuming_state(self) -> None:
        """Close the state queue's channel: what it delivered and nobody acked goes back to
        the queue, for the next consumer."""
        channel, self._consuming = self._consuming, None
        if channel is not None:
            with contextlib.suppress(Exception):
                await channel.close()

    async def _connect_loop(self) -> None:
        failures = 0
        while True:
            url = self.nodes.current
            try:
                connection = await aio_pika.connect_robust(
                    amqp_url_with_heartbeat(url, self.settings.amqp_heartbeat_s),
                    client_properties={"connection_name": "manager"},
                    reconnect_interval=_RECONNECT_FIRST_S,
                )
                break
            except Exception as e:  # noqa: BLE001 - any failure: retry
                self.nodes.failed()
                failures += 1
                delay = reconnect_interval(failures)
                logger.warning(
                    "broker unreachable at %s (%s); retrying in %.1fs",
                    node_name(url),
                    describe_connect_failure(e, url),
                    delay,
                )
                await asyncio.sleep(delay)
        self._connection = connection
        connection.reconnect_callbacks.add(self._on_reconnect)
        connection.close_callbacks.add(self._on_connection_lost)
        self.connects += 1
        self._pub = await connection.channel(publisher_confirms=True)
        await topology.declare_common(self._pub, self.settings.queue_type)
        # Declared by every manager: the state backlog is read by a passive declare.
        await topology.declare_state_queue(self._pub, self.settings.queue_type)
        self.ready.set()
        logger.info("connected to the broker at %s", self.nodes.describe())

    def _on_reconnect(self, *_: object) -> None:
        if self._lost_at is not None:
            logger.info(
                "reconnected to the broker after %.1fs, at %s",
                asyncio.get_running_loop().time() - self._lost_at,
                self.nodes.describe(),
            )
            self._lost_at = None
        self.connects += 1
        self._declared_pools.clear()  # a new broker may lack them
        self.reconnected.set()

    def _on_connection_lost(self, _connection: object, reason: BaseException | None = None) -> None:
        connection = self._connection
        if connection is None or connection.close_called or self._pacing is not None:
            return  # closed on purpose, or already being paced
        # The one line an outage writes when it begins: aio-pika's and aiormq's own records of
        # it (an ERROR and a traceback per attempt) are debug chatter (``shared.logs``).
        logger.warning("lost the broker connection (%s); reconnecting", _reason(reason, self.settings.amqp_heartbeat_s))
        self._lost_at = asyncio.get_running_loop().time()
        self._pacing = asyncio.create_task(self._pace_reconnects(connection), name="broker-reconnect-pace")

    async def _pace_reconnects(self, connection: AbstractRobustConnection) -> None:
        """aio-pika retries a lost connection at a fixed ``reconnect_interval``: a long one
        leaves the manager down up to that long after the broker is back (figures:
        docs/bench-history.md, "2026-11-28, twelfth session"), a short one hammers the broker
        and the log through a long outage. So each attempt waits longer, as a service's do
        (``reconnect_interval``): a blip costs a fraction of a second, a long outage one
        attempt every 2.5 to 5 s."""
        loop = asyncio.get_running_loop()
        lost_at = remind_at = loop.time()
        attempts = 0
        try:
            while not connection.connected.is_set() and not connection.close_called:
                down_for = loop.time() - lost_at
                attempts += 1
                interval = reconnect_interval(attempts)
                connection.reconnect_interval = interval  # type: ignore[attr-defined]
                if len(self.nodes.urls) > 1:
                    # aio-pika reconnects to ``connection.url``: each attempt goes to the next
                    # node of a cluster (the lost one most likely went away with its node). One
                    # node: the URL aio-pika was given stays untouched.
                    url = self.nodes.failed()
                    connection.url = URL(amqp_url_with_heartbeat(url, self.settings.amqp_heartbeat_s))  # type: ignore[attr-defined]
                if loop.time() - remind_at >= _STILL_DOWN_EVERY_S:
                    remind_at = loop.time()
                    logger.warning(
                        "the broker is still unreachable after %.0fs; trying every %.1fs (the last attempt: %s)",
                        down_for,
                        interval,
                        self._last_attempt(),
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(connection.connected.wait(), interval)
        finally:
            connection.reconnect_interval = _RECONNECT_FIRST_S  # type: ignore[attr-defined]
            self._pacing = None

    def _last_attempt(self) -> str:
        """Why the last attempt to reconnect failed, as aio-pika logged it (shown at DEBUG)."""
        said = last_chatter("aio_pika.robust_connection")
        if said is None:
            return "no answer yet"
        return vhost_refused_text(self.nodes.current) if vhost_refused(said) else said

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
        every hosted observer (``manager/repairs/rebuild.py``)."""
        if self._marker_seen == self.connects:
            return
        connects = self.connects
        if not await self.probes.marker_present():
            raise BrokerUnavailable(
                "the broker is new or lost its data and is being rebuilt from the database; retry in a few seconds"
            )
        self._marker_seen = connects

    async def close(self) -> None:
        if self._pacing is not None:
            self._pacing.cancel()
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
                for pool in sorted({s.pool for s in starts} - self._declared_pools):
                    # Many creates arrive at once: declare each pool's queue once, not per publish.
                    async with self._declare_lock:
                        if pool not in self._declared_pools:
                            await topology.declare_start_queue(channel, pool, self.settings.queue_type)
                            self._declared_pools.add(pool)
                raw = await self._unblocked(channel)
                publish = publish_batch(
                    cast(aiormq.Channel, raw),
                    [
                        BatchMessage(
                            topology.start_queue_name(start.pool),
                            start.encode(),
                            topology.persistent_properties(str(start.message_id)),
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

    async def publish_control(self, message: Message) -> None:
        """Send a control command: to every service over the control fanout, or, when it
        names one (``service_id``), straight to that service's own control queue.

        In a failover, each observer moved while the manager still counts its dead host alive
        makes a stop aimed at that host (``observer_reports.started``); broadcast, every
        survivor would decode them all on its holding thread and throw them away (figures:
        docs/cost-curve.md). Sent to the target's queue, a command for a host that is gone
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
        """Messages ready in a pool's start queue (declared if missing, with its arguments:
        a passive declare of a missing queue would close the channel), or None if unknown."""
        try:
            with cancelled_calls_as_errors():
                channel = await self._channel()
                raw = await channel.get_underlay_channel()  # the robust channel caches counts
                result = await raw.queue_declare(
                    topology.start_queue_name(pool),
                    durable=True,
                    arguments=topology.start_queue_arguments(pool, self.settings.queue_type),
                )
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
