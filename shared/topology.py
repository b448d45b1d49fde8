"""AMQP topology: every exchange and queue name and argument, and one idempotent declare.

    start queues  orch.start.<pool>     durable, ``ORCH_START_QUEUES`` per pool (the second
                  orch.start.<pool>.1   on: .1, .2, ...); StartObserver messages, held unacked
                                        by the service running the observer; an observer's
                                        start always goes to the same one (``start_queue_index``)
    state queue   orch.state            durable, single active consumer (one manager applies)
    control       orch.control          fanout; each service instance binds its own
                                        exclusive queue orch.control.<service_id>
                  orch.control.direct   direct; the same queue, by its service id: commands
                                        aimed at one service
    events        observers.events      topic; ctx.emit() publishes <kind>.<observer name>
    dead letters  orch.dead             direct; <queue> -> <queue>.error for every queue above
    marker        orch.manager.marker   durable, empty, declared only by the manager's state side
                                        once the broker holds every start: missing on connect
                                        means the broker lost its data (manager/repairs/rebuild.py)
    lease         orch.lease            quorum only: services' lease round trips are publishes
                                        confirmed by a majority of the nodes (nothing consumes it)

The durable queues are of the deployment's ``ORCH_QUEUE_TYPE``: classic on one node, quorum
on a cluster (docs/design.md, "On a RabbitMQ cluster"). A quorum start queue has no delivery
limit (4.3's default of 20 counts consumer deaths) and its consumers no timeout.

Both the manager and the services declare what they use with the same arguments, so
either can start first. Queue arguments must never change for an existing queue
(RabbitMQ refuses a redeclare with other arguments): add a new queue instead. The one
exception, ``HAND_ON_ARGUMENT``, is added only where the queue takes it (``_declare_handing_on``).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
import zlib
from typing import Any, Literal

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue

STATE_QUEUE = "orch.state"
CONTROL_EXCHANGE = "orch.control"
CONTROL_DIRECT_EXCHANGE = "orch.control.direct"
CONTROL_ERROR_KEY = "orch.control"
EVENTS_EXCHANGE = "observers.events"
DEAD_LETTER_EXCHANGE = "orch.dead"
REBUILD_MARKER = "orch.manager.marker"
LEASE_QUEUE = "orch.lease"

logger = logging.getLogger(__name__)

QueueType = Literal["classic", "quorum"]
# A quorum queue drops a start returned this many times: 20 by default since 4.0, and a
# service's death counts. -1 lifts the limit on 4.x but, on 3.10, dead-letters a start at its first
# return; the largest 32-bit value is no limit in practice on every series.
NO_DELIVERY_LIMIT = 2**31 - 1
# A consume argument wins over every policy and setting on a quorum queue (4.3); ten years.
HELD_FOR_GOOD: dict[str, Any] = {"x-consumer-timeout": 315_360_000_000}
# How long a quorum start or state queue keeps the deliveries of a consumer whose node's link
# went down before it hands them on (T; the broker's own default is 60 s). Safe because a
# holder acts only while its lease is valid, at most half of it (docs/design.md, "How soon
# the starts of a dead node may move"). Known from 4.3.0; 4.0 and 3.10 ignore it.
HAND_ON_AFTER_MS = 2000
HAND_ON_ARGUMENT = "x-consumer-disconnected-timeout"
# The longest a queue holds a start for an ended session on RabbitMQ's defaults, twice over:
# a cut is seen after up to 1.25 net_ticktime (75 s), then consumer_disconnected_timeout (60 s).
BROKER_HOLDS_AT_MOST_S = 300.0
# Quorum queues this process found declared before that argument: a redeclare that adds it
# is refused (an argument must be repeated exactly), so they are redeclared as they are.
_DECLARED_WITHOUT_HAND_ON: set[str] = set()


def start_queue_name(pool: str, index: int = 0) -> str:
    """A pool's start queue ``index``: the first keeps the name of the one queue of a pool
    before there were several, so one queue is the layout of N with N = 1."""
    return f"orch.start.{pool}" + (f".{index}" if index else "")


def start_queue_names(pool: str, queues: int) -> list[str]:
    return [start_queue_name(pool, index) for index in range(queues)]


def start_queue_index(observer_id: uuid.UUID, queues: int) -> int:
    """Which of a pool's ``queues`` start queues an observer's starts go to: the same one every
    time for a given N (the lost-start repair, the rebuild, a restart), spread evenly."""
    return zlib.crc32(observer_id.bytes) % queues if queues > 1 else 0


def marker_name(session: str, queue: str) -> str:
    """The exchange a service's broker session ``session`` (its id, hex) binds ``queue`` to,
    whose deletion with the queue's last binding says the queue was deleted
    (``observer_service/queue_watch.py``)."""
    return f"orch.watch.{session}.{queue}"


def error_queue_name(queue: str) -> str:
    return f"{queue}.error"


def control_queue_name(service_id: uuid.UUID, session_id: uuid.UUID | None = None) -> str:
    """A service's control queue; with ``session_id``, the one a session declares when the
    service's usual one is still held by its previous session's node, which is down (on a
    cluster such a queue stays until that node returns)."""
    return f"{CONTROL_EXCHANGE}.{service_id}" + (f".{session_id}" if session_id is not None else "")


def _dead_letter_args(routing_key: str) -> dict[str, Any]:
    return {"x-dead-letter-exchange": DEAD_LETTER_EXCHANGE, "x-dead-letter-routing-key": routing_key}


def _typed(queue_type: QueueType) -> dict[str, Any]:
    return {"x-queue-type": "quorum"} if queue_type == "quorum" else {}


async def _declare_error_queue(
    channel: AbstractChannel, dead: AbstractExchange, key: str, queue_type: QueueType
) -> None:
    queue = await channel.declare_queue(error_queue_name(key), durable=True, arguments=_typed(queue_type))
    await queue.bind(dead, routing_key=key)


async def declare_common(channel: AbstractChannel, queue_type: QueueType = "classic") -> None:
    """Exchanges, the state queue and its error queue (and on a cluster the lease queue)."""
    dead = await channel.declare_exchange(DEAD_LETTER_EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True)
    await channel.declare_exchange(CONTROL_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)
    await channel.declare_exchange(CONTROL_DIRECT_EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True)
    await channel.declare_exchange(EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
    await _declare_error_queue(channel, dead, STATE_QUEUE, queue_type)
    await _declare_error_queue(channel, dead, CONTROL_ERROR_KEY, queue_type)
    await declare_state_queue(channel, queue_type)
    if queue_type == "quorum":
        await declare_lease_queue(channel)


async def declare_state_queue(channel: AbstractChannel, queue_type: QueueType = "classic") -> AbstractQueue:
    args = _dead_letter_args(STATE_QUEUE) | {"x-single-active-consumer": True} | _typed(queue_type)
    return await _declare_handing_on(channel, STATE_QUEUE, args, queue_type)


async def declare_start_queue(
    channel: AbstractChannel, pool: str, queue_type: QueueType = "classic", index: int = 0
) -> AbstractQueue:
    """The pool's start queue ``index`` and its error queue. No message TTL and no delivery
    limit: a start message must survive any number of service crashes."""
    name = start_queue_name(pool, index)
    dead = await channel.get_exchange(DEAD_LETTER_EXCHANGE, ensure=False)
    await _declare_error_queue(channel, dead, name, queue_type)
    return await _declare_handing_on(channel, name, _start_args(name, queue_type), queue_type)


def start_queue_arguments(pool: str, queue_type: QueueType = "classic", index: int = 0) -> dict[str, Any]:
    """The arguments the pool's start queue ``index`` was last declared with by this process."""
    name = start_queue_name(pool, index)
    args = _start_args(name, queue_type)
    if queue_type == "quorum" and name not in _DECLARED_WITHOUT_HAND_ON:
        args[HAND_ON_ARGUMENT] = HAND_ON_AFTER_MS
    return args


def _start_args(name: str, queue_type: QueueType) -> dict[str, Any]:
    """A start queue's arguments but the hand-on timeout (``_declare_handing_on`` adds it)."""
    args = _dead_letter_args(name) | _typed(queue_type)
    if queue_type == "quorum":
        args["x-delivery-limit"] = NO_DELIVERY_LIMIT
    return args


async def _declare_handing_on(
    channel: AbstractChannel, name: str, args: dict[str, Any], queue_type: QueueType
) -> AbstractQueue:
    """Declare a durable queue; a quorum one with ``HAND_ON_ARGUMENT``, unless it exists
    without it. That is tried first on a channel of its own, since a refused declare closes its
    channel; any other refusal is left to the declare on ``channel``, which says it as before."""
    if queue_type != "quorum":
        return await channel.declare_queue(name, durable=True, arguments=args)
    handing_on = args | {HAND_ON_ARGUMENT: HAND_ON_AFTER_MS}
    raw = await channel.get_underlay_channel()
    trial = await raw.connection.channel()
    try:
        await trial.queue_declare(name, durable=True, arguments=handing_on)
    except aiormq.exceptions.AMQPChannelError as e:
        if not isinstance(e, aiormq.exceptions.ChannelPreconditionFailed) or HAND_ON_ARGUMENT not in str(e):
            return await channel.declare_queue(name, durable=True, arguments=handing_on)
        if name not in _DECLARED_WITHOUT_HAND_ON:
            logger.error(
                "queue %s was declared before %s (an older release): after a broker node's death its "
                "deliveries wait the broker's consumer_disconnected_timeout (60 s by default), not %.0f s; "
                'add "consumer-disconnected-timeout": %d to the policy that applies to it (rabbitmqctl '
                "set_policy ... --apply-to quorum_queues; it reaches existing queues)",
                name,
                HAND_ON_ARGUMENT,
                HAND_ON_AFTER_MS / 1000,
                HAND_ON_AFTER_MS,
            )
        _DECLARED_WITHOUT_HAND_ON.add(name)
        return await channel.declare_queue(name, durable=True, arguments=args)
    with contextlib.suppress(Exception):
        await trial.close()
    _DECLARED_WITHOUT_HAND_ON.discard(name)
    return await channel.declare_queue(name, durable=True, arguments=handing_on)


async def declare_marker(channel: AbstractChannel, queue_type: QueueType = "classic") -> AbstractQueue:
    return await channel.declare_queue(REBUILD_MARKER, durable=True, arguments=_typed(queue_type))


async def declare_lease_queue(channel: AbstractChannel) -> AbstractQueue:
    """The quorum queue the services' lease round trips publish to: a confirm from it means
    a majority of the nodes took the write. Nothing consumes it; each message lives a minute
    and at most a thousand are kept."""
    args: dict[str, Any] = {"x-queue-type": "quorum", "x-message-ttl": 60_000, "x-max-length": 1000}
    args["x-overflow"] = "drop-head"
    return await channel.declare_queue(LEASE_QUEUE, durable=True, arguments=args)


async def declare_control_queue(
    channel: AbstractChannel, service_id: uuid.UUID, session_id: uuid.UUID | None = None
) -> AbstractQueue:
    """This service instance's own queue (gone when it disconnects), bound to the control
    fanout and, by its service id, to the direct control exchange."""
    queue = await channel.declare_queue(
        control_queue_name(service_id, session_id),
        exclusive=True,
        auto_delete=True,
        arguments=_dead_letter_args(CONTROL_ERROR_KEY),
    )
    await queue.bind(CONTROL_EXCHANGE)
    await queue.bind(CONTROL_DIRECT_EXCHANGE, routing_key=str(service_id))
    return queue


def persistent_properties(message_id: str, headers: dict[str, Any] | None = None) -> aiormq.spec.Basic.Properties:
    """The properties of ``persistent`` for a publish on the underlying aiormq channel (a
    batch of thousands of starts, where aio-pika's ``Message`` wrapper costs the manager
    too much: docs/design.md, "Where the time goes"). ``headers``: a trace's context
    (``shared/tracing.py``), None while traces are off."""
    return aiormq.spec.Basic.Properties(
        content_type="application/json", delivery_mode=2, message_id=message_id, headers=headers
    )


def persistent(
    body: bytes, *, message_id: str | None = None, headers: dict[str, Any] | None = None
) -> aio_pika.Message:
    """A persistent JSON message (aio-pika's default is transient)."""
    return aio_pika.Message(
        body,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=message_id,
        headers=headers,
    )
