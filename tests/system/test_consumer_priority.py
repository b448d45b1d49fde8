"""The broker facts placement rests on (docs/design.md, "Even load"), on classic and quorum
start queues of every supported series (``make test-broker``):

* a start goes to the consumer of the highest ``x-priority`` that has prefetch credit left;
  lower ones get starts only while every higher one is full;
* a consumer cancelled and consumed again on the same channel, with a new priority, keeps
  every delivery it held: they stay unacked, can still be acked by their tag, and one handed
  back goes to the consumer whose priority is now the highest;
* but the new consumer gets a whole new prefetch window: what the cancelled one holds does
  not count against it;
* except on a quorum queue of RabbitMQ 4 consumed again under the same tag: the cancelled
  consumer's record is taken up, one per channel, and its prefetch counts what it holds;
* a negative priority is taken as one (a service stepping aside for a start it cannot run,
  ``observer_service/declines.py``): below every placement, it gets starts only while every
  other consumer is full, and a start it hands back goes to one with credit, not back to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

from shared import topology
from tools import infra


@pytest.fixture
async def connection(rabbit: infra.RabbitNode, vhost: str) -> AsyncIterator[AbstractConnection]:
    conn = await aio_pika.connect(rabbit.url_for(vhost))
    yield conn
    await conn.close()


class Holder:
    """A service's start consumer, reduced: a prefetch, a priority, deliveries kept unacked."""

    def __init__(self, channel: AbstractChannel, queue: AbstractQueue, arguments: dict[str, Any]) -> None:
        self.channel, self.queue, self.arguments = channel, queue, arguments
        self.held: list[AbstractIncomingMessage] = []
        self.tag: str | None = None

    @classmethod
    async def open(
        cls, connection: AbstractConnection, queue_name: str, queue_type: topology.QueueType, prefetch: int = 10
    ) -> Holder:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        arguments = topology.HELD_FOR_GOOD if queue_type == "quorum" else {}  # as the services consume
        return cls(channel, await channel.get_queue(queue_name, ensure=False), arguments)

    async def consume(self, priority: int) -> None:
        async def hold(message: AbstractIncomingMessage) -> None:
            self.held.append(message)

        self.tag = await self.queue.consume(hold, arguments={**self.arguments, "x-priority": priority})

    async def reconsume(self, priority: int) -> None:
        assert self.tag is not None
        await self.queue.cancel(self.tag)
        await self.consume(priority)


async def _until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _ready(channel: AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    return int(declared.declaration_result.message_count or 0)


async def _publish(connection: AbstractConnection, queue: str, n: int) -> None:
    channel = await connection.channel()
    for _ in range(n):
        await channel.default_exchange.publish(aio_pika.Message(b"start"), routing_key=queue)
    await channel.close()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_starts_go_to_the_highest_priority_with_credit_and_a_reconsume_keeps_what_it_holds(
    connection: AbstractConnection, queue_type: topology.QueueType
) -> None:
    declare = await connection.channel()
    await topology.declare_common(declare, queue_type)
    queue = await topology.declare_start_queue(declare, f"prio-{queue_type}", queue_type)
    high = await Holder.open(connection, queue.name, queue_type)
    low = await Holder.open(connection, queue.name, queue_type)
    await high.consume(priority=5)
    await low.consume(priority=1)

    # The high one takes all it may hold before the low one gets any
    await _publish(connection, queue.name, 15)
    await _until(lambda: len(high.held) + len(low.held) == 15, "15 deliveries")
    assert (len(high.held), len(low.held)) == (10, 5)

    # Consumed again below the other, it keeps its ten: none goes back to the queue
    await high.reconsume(priority=0)
    await asyncio.sleep(0.5)
    assert len(high.held) == 10 and await _ready(declare, queue.name) == 0
    await _publish(connection, queue.name, 3)
    await _until(lambda: len(low.held) == 8, "the new starts at the now higher consumer")
    assert len(high.held) == 10

    # Its old deliveries are still its own: acked by tag, or handed back to the higher one
    await high.held[0].ack()
    await high.held[1].nack(requeue=True)
    await _until(lambda: len(low.held) == 9, "the handed-back start at the higher consumer")
    assert len(high.held) == 10 and not high.channel.is_closed and not low.channel.is_closed
    assert await _ready(declare, queue.name) == 0


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_a_consumer_consumed_again_gets_a_whole_new_prefetch_window(
    connection: AbstractConnection, queue_type: topology.QueueType
) -> None:
    """Why ``observer_service/start_consumers.py`` opens each new consumer with the window its
    channel has left: the prefetch counts one consumer's deliveries, and what the cancelled
    one still holds counts for nothing."""
    declare = await connection.channel()
    await topology.declare_common(declare, queue_type)
    queue = await topology.declare_start_queue(declare, f"window-{queue_type}", queue_type)
    one = await Holder.open(connection, queue.name, queue_type, prefetch=1)
    await one.consume(priority=0)
    await _publish(connection, queue.name, 2)
    await _until(lambda: len(one.held) == 1, "the first delivery")
    await asyncio.sleep(0.3)
    assert len(one.held) == 1 and await _ready(declare, queue.name) == 1  # the limit holds

    await one.reconsume(priority=1)
    await _until(lambda: len(one.held) == 2, "the second delivery, past the limit of one")


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_a_consumer_at_a_negative_priority_hands_a_start_on_and_gets_starts_only_when_the_others_are_full(
    connection: AbstractConnection, queue_type: topology.QueueType
) -> None:
    declare = await connection.channel()
    await topology.declare_common(declare, queue_type)
    queue = await topology.declare_start_queue(declare, f"aside-{queue_type}", queue_type)
    emptiest = await Holder.open(connection, queue.name, queue_type, prefetch=10)
    other = await Holder.open(connection, queue.name, queue_type, prefetch=3)
    await emptiest.consume(priority=2)
    await other.consume(priority=0)
    await _publish(connection, queue.name, 1)
    await _until(lambda: len(emptiest.held) == 1, "the start at the emptiest")

    # Stepping aside below zero, then handing the start back: it goes to the other consumer
    await emptiest.reconsume(priority=-1)
    await emptiest.held[0].nack(requeue=True)
    await _until(lambda: len(other.held) == 1, "the handed-back start at the other consumer")
    await asyncio.sleep(0.3)
    assert len(emptiest.held) == 1  # only the one it handed back, still counted as its own

    # New starts go to the other until it is full, then to the one at -1
    await _publish(connection, queue.name, 4)
    await _until(lambda: len(other.held) == 3 and len(emptiest.held) == 3, "the other full, two at -1")
    assert await _ready(declare, queue.name) == 0


async def test_a_quorum_consumer_consumed_again_under_its_own_tag_takes_up_its_record(
    connection: AbstractConnection, rabbit: infra.RabbitNode, vhost: str
) -> None:
    """Why ``observer_service/start_consumers.py`` consumes a quorum queue again under the
    channel's own tag on RabbitMQ 4: the queue keeps a cancelled consumer's record while it
    holds deliveries (``rabbit_fifo``), one more at each consume under a new tag, and looks
    records up by tag by walking them all (``consumer_key_from_id``, ``find_consumer``). Under
    the old tag the record is taken up again (``merge_consumer``): one record per channel, and
    its prefetch counts what it already holds, so the credit comes back with every settle.
    3.10's channel crashes on the first delivery to a record taken up so (function_clause in
    ``rabbit_channel:handle_deliver0``): there, a new tag each time."""
    if rabbit.install.series == "3.10":
        pytest.skip("3.10 closes the connection (INTERNAL_ERROR) at the first delivery: see the docstring")
    declare = await connection.channel()
    await topology.declare_common(declare, "quorum")
    queue = await topology.declare_start_queue(declare, "merge-quorum", "quorum")
    one = await Holder.open(connection, queue.name, "quorum", prefetch=4)

    async def hold(message: AbstractIncomingMessage) -> None:
        one.held.append(message)

    arguments = {**topology.HELD_FOR_GOOD, "x-priority": 0}
    await one.queue.consume(hold, arguments=arguments, consumer_tag="own")
    await _publish(connection, queue.name, 10)
    await _until(lambda: len(one.held) == 4, "four deliveries")

    for priority in (1, 2, 0):  # placements changed three times
        await one.queue.cancel("own")
        await one.channel.set_qos(prefetch_count=6)  # what it holds and two more
        await one.queue.consume(hold, arguments={**arguments, "x-priority": priority}, consumer_tag="own")
    await _until(lambda: len(one.held) == 6, "two more: the prefetch counts the four held")
    await asyncio.sleep(0.3)
    assert len(one.held) == 6 and await _ready(declare, queue.name) == 4
    assert _fifo_consumers(rabbit, vhost, queue.name) == 1

    await one.held[0].ack()  # a slot of the first consume comes back to the record by itself
    await _until(lambda: len(one.held) == 7, "the slot given back refilled")
    await asyncio.sleep(0.3)
    assert len(one.held) == 7 and not one.channel.is_closed


def _fifo_consumers(rabbit: infra.RabbitNode, vhost: str, queue: str) -> int:
    """The consumer records a quorum queue keeps, cancelled ones holding deliveries included."""
    expression = (
        f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"{vhost}">>, queue, <<"{queue}">>)), '
        "{RaName, _} = amqqueue:get_pid(Q), "
        "{ok, {_, O}, _} = ra:local_query({RaName, node()}, fun rabbit_fifo:overview/1), "
        "maps:get(num_consumers, O)."
    )
    return int(rabbit.ctl("eval", expression).strip())
