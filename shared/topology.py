"""AMQP topology: every exchange and queue name and argument, and one idempotent declare.

    start queue   orch.start.<pool>     durable classic, one per pool; StartObserver messages,
                                        held unacked by the service running the observer
    state queue   orch.state            durable, single active consumer (one manager applies)
    control       orch.control          fanout; each service instance binds its own
                                        exclusive queue orch.control.<service_id>
    events        observers.events      topic; ctx.emit() publishes <kind>.<observer name>
    dead letters  orch.dead             direct; <queue> -> <queue>.error for every queue above
    marker        orch.manager.marker   durable, empty, declared only by the manager's state side
                                        once the broker holds every start: missing on connect
                                        means the broker lost its data (manager/repairs/rebuild.py)

Both the manager and the services declare what they use with the same arguments, so
either can start first. Queue arguments must never change for an existing queue
(RabbitMQ refuses a redeclare with other arguments): add a new queue instead.
"""

from __future__ import annotations

import uuid
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue

STATE_QUEUE = "orch.state"
CONTROL_EXCHANGE = "orch.control"
CONTROL_ERROR_KEY = "orch.control"
EVENTS_EXCHANGE = "observers.events"
DEAD_LETTER_EXCHANGE = "orch.dead"
REBUILD_MARKER = "orch.manager.marker"


def start_queue_name(pool: str) -> str:
    return f"orch.start.{pool}"


def error_queue_name(queue: str) -> str:
    return f"{queue}.error"


def control_queue_name(service_id: uuid.UUID) -> str:
    return f"{CONTROL_EXCHANGE}.{service_id}"


def _dead_letter_args(routing_key: str) -> dict[str, Any]:
    return {"x-dead-letter-exchange": DEAD_LETTER_EXCHANGE, "x-dead-letter-routing-key": routing_key}


async def _declare_error_queue(channel: AbstractChannel, dead: AbstractExchange, key: str) -> None:
    queue = await channel.declare_queue(error_queue_name(key), durable=True)
    await queue.bind(dead, routing_key=key)


async def declare_common(channel: AbstractChannel) -> None:
    """Exchanges, the state queue and its error queue."""
    dead = await channel.declare_exchange(DEAD_LETTER_EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True)
    await channel.declare_exchange(CONTROL_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)
    await channel.declare_exchange(EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
    await _declare_error_queue(channel, dead, STATE_QUEUE)
    await _declare_error_queue(channel, dead, CONTROL_ERROR_KEY)
    await declare_state_queue(channel)


async def declare_state_queue(channel: AbstractChannel) -> AbstractQueue:
    args = _dead_letter_args(STATE_QUEUE) | {"x-single-active-consumer": True}
    return await channel.declare_queue(STATE_QUEUE, durable=True, arguments=args)


async def declare_start_queue(channel: AbstractChannel, pool: str) -> AbstractQueue:
    """The pool's start queue and its error queue. No message TTL and no delivery limit:
    a start message must survive any number of host crashes."""
    name = start_queue_name(pool)
    dead = await channel.get_exchange(DEAD_LETTER_EXCHANGE, ensure=False)
    await _declare_error_queue(channel, dead, name)
    return await channel.declare_queue(name, durable=True, arguments=start_queue_arguments(pool))


def start_queue_arguments(pool: str) -> dict[str, Any]:
    return _dead_letter_args(start_queue_name(pool))


async def declare_control_queue(channel: AbstractChannel, service_id: uuid.UUID) -> AbstractQueue:
    """This service instance's own queue on the control fanout (gone when it disconnects)."""
    queue = await channel.declare_queue(
        control_queue_name(service_id),
        exclusive=True,
        auto_delete=True,
        arguments=_dead_letter_args(CONTROL_ERROR_KEY),
    )
    await queue.bind(CONTROL_EXCHANGE)
    return queue


def persistent_properties(message_id: str) -> aiormq.spec.Basic.Properties:
    """The properties of ``persistent`` for a publish on the underlying aiormq channel (a
    batch of thousands of starts, where aio-pika's ``Message`` wrapper costs the manager
    too much: docs/design.md, "Where the time goes")."""
    return aiormq.spec.Basic.Properties(content_type="application/json", delivery_mode=2, message_id=message_id)


def persistent(body: bytes, *, message_id: str | None = None) -> aio_pika.Message:
    """A persistent JSON message (aio-pika's default is transient)."""
    return aio_pika.Message(
        body,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=message_id,
    )
