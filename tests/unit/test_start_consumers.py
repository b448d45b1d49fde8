"""``observer_service.start_consumers``: each consumer is opened with the window its channel has
left, and consumes again once enough of what it held before was settled (a new consumer's
prefetch does not count what the cancelled one holds: ``tests/system/test_consumer_priority.py``)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aio_pika.abc import AbstractChannel

from observer_service.start_channel import StartChannel
from observer_service.start_consumers import Placement, StartConsumers
from shared.messages import EVEN, OVER, UNDER


class FakeChannel:
    """Records the prefetch windows set and the consumes and cancels made on one channel."""

    def __init__(self) -> None:
        self.windows: list[int] = []
        self.consumes: list[dict[str, Any]] = []
        self.cancelled: list[str] = []
        self.tags: list[str | None] = []  # the tag each consume asked for

    async def set_qos(self, prefetch_count: int) -> None:
        self.windows.append(prefetch_count)

    async def consume(self, queue: str, arguments: dict[str, Any], tag: str | None = None) -> str:
        self.consumes.append(arguments)
        self.tags.append(tag)
        return tag or f"tag-{len(self.consumes)}"

    async def basic_cancel(self, tag: str) -> None:
        self.cancelled.append(tag)


async def held_by(size: int) -> tuple[StartConsumers, FakeChannel]:
    starts = StartConsumers(quorum=False, placement=Placement())
    fake = FakeChannel()
    await hold(starts, fake, "orch.start.default", size, size)
    return starts, fake


async def hold(starts: StartConsumers, fake: FakeChannel, queue: str, size: int, workers: int) -> None:
    await starts.hold(cast(AbstractChannel, fake), cast(StartChannel, fake), "default", queue, size, workers)


async def settle_tasks() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_consumer_consumed_again_gets_only_the_window_its_channel_has_left() -> None:
    starts, fake = await held_by(size=4)
    assert fake.windows == [4] and fake.consumes == [{"x-priority": 1}]  # even, until told
    for tag in (1, 2, 3):
        starts.delivered(fake, tag)

    await starts.place(Placement(priority=2))
    assert fake.cancelled == ["tag-1"] and fake.windows == [4, 1] and fake.consumes[-1] == {"x-priority": 2}


async def test_a_full_channel_waits_and_consumes_again_once_a_slot_is_given_back() -> None:
    starts, fake = await held_by(size=2)
    starts.delivered(fake, 1)
    starts.delivered(fake, 2)
    await starts.place(Placement(priority=2))
    assert len(fake.consumes) == 1  # full: no consumer, rather than a window of 0 (no limit at all)

    starts.settled(fake, 1)
    await settle_tasks()
    assert fake.windows[-1] == 1 and fake.consumes[-1] == {"x-priority": 2}


async def test_slots_of_older_deliveries_come_back_by_consuming_again() -> None:
    starts, fake = await held_by(size=40)
    for tag in range(1, 21):
        starts.delivered(fake, tag)
    await starts.place(Placement(priority=2))  # window 20: the 20 held belong to the old consumer
    assert fake.windows[-1] == 20
    starts.settled(fake, 1)  # one old slot back: fewer than 40 // 20, no new consume yet
    await settle_tasks()
    assert len(fake.consumes) == 2
    starts.settled(fake, 2)
    await settle_tasks()
    assert len(fake.consumes) == 3 and fake.windows[-1] == 22


async def test_cordoned_or_stopped_it_consumes_nothing() -> None:
    starts, fake = await held_by(size=4)
    await starts.place(Placement(priority=2, cordoned=True))
    assert fake.cancelled == ["tag-1"] and len(fake.consumes) == 1
    starts.delivered(fake, 1)
    starts.settled(fake, 1)
    await settle_tasks()
    assert len(fake.consumes) == 1
    await starts.place(Placement(priority=2))
    await starts.stop()
    assert len(fake.consumes) == 2 and fake.cancelled == ["tag-1", "tag-2"]


async def test_a_queue_stepped_aside_is_consumed_below_every_placement_then_under_its_own_again() -> None:
    starts, fake = await held_by(size=4)
    starts.delivered(fake, 1)
    await starts.place(Placement(priority=2))

    await starts.step_aside("default", 0.2)
    assert fake.consumes[-1] == {"x-priority": -1}
    assert starts.delivered(fake, 2) == "aside"  # came to the consumer stepped aside
    await starts.step_aside("default", 0.3)  # extended: no new consume
    assert len(fake.consumes) == 3

    await asyncio.sleep(0.2)
    assert fake.consumes[-1] == {"x-priority": -1}  # still aside: the second step extended it
    await asyncio.sleep(0.2)
    assert fake.consumes[-1] == {"x-priority": 2} and len(fake.consumes) == 4
    assert starts.delivered(fake, 3) == "run"


async def test_a_cordoned_service_steps_aside_without_consuming() -> None:
    starts, fake = await held_by(size=4)
    await starts.place(Placement(cordoned=True))
    await starts.step_aside("default", 0.05)
    await asyncio.sleep(0.1)
    assert len(fake.consumes) == 1  # the first, before the cordon


async def test_a_used_up_window_waits_for_a_twentieth_of_its_channel_over_one_queue() -> None:
    """Each new consume leaves a record in a quorum queue while the one before holds
    deliveries: a channel that still consumes is not consumed again at every slot back."""
    starts, fake = await held_by(size=100)
    for tag in range(1, 100):
        starts.delivered(fake, tag)
    await starts.place(Placement(priority=2))  # window 1
    starts.delivered(fake, 100)  # the window is used up
    for tag in range(1, 5):
        starts.settled(fake, tag)
    await settle_tasks()
    assert len(fake.consumes) == 2
    starts.settled(fake, 5)  # the fifth: 100 // 20
    await settle_tasks()
    assert len(fake.consumes) == 3 and fake.windows[-1] == 5


async def several_queues(workers: int) -> tuple[StartConsumers, list[FakeChannel]]:
    starts = StartConsumers(quorum=True, placement=Placement(start_queues=3))
    fakes = [FakeChannel() for _ in range(3)]
    for index, fake in enumerate(fakes):
        await hold(starts, fake, f"orch.start.default.{index}", workers, workers)
    return starts, fakes


async def test_over_several_queues_each_consumer_gets_at_most_the_pools_free_workers() -> None:
    starts, (a, b, c) = await several_queues(workers=4)
    assert a.windows == b.windows == c.windows == [4]
    for tag in (1, 2, 3):
        assert starts.delivered(a, tag) == "run"
    await starts.place(Placement(priority=2, start_queues=3))
    assert b.windows[-1] == 1 and c.windows[-1] == 1  # what the pool has left, not the channel


async def test_what_comes_past_the_pools_workers_is_excess_and_pauses_the_pool() -> None:
    starts, (a, b, c) = await several_queues(workers=2)
    assert starts.delivered(a, 1) == "run"
    assert starts.delivered(b, 1) == "run"
    assert starts.delivered(c, 1) == "excess"  # three queues delivered at once: never run
    await starts.pause(c)
    assert a.cancelled == ["tag-1"] and b.cancelled == ["tag-1"] and c.cancelled == ["tag-1"]

    starts.settled(c, 1)  # the excess handed back: still full, nothing to consume with
    await settle_tasks()
    assert [len(f.consumes) for f in (a, b, c)] == [1, 1, 1]
    starts.settled(a, 1)  # an observer stopped: one worker free, every queue offered it
    await settle_tasks()
    assert [len(f.consumes) for f in (a, b, c)] == [2, 2, 2]
    assert a.windows[-1] == b.windows[-1] == c.windows[-1] == 1


async def test_once_the_excess_is_handed_back_a_free_worker_is_offered_on_every_queue() -> None:
    starts, (a, b, c) = await several_queues(workers=1)
    starts.delivered(a, 1)
    assert starts.delivered(b, 1) == "excess"
    starts.settled(a, 1)  # the one that ran stopped before the pause
    await starts.pause(b)  # still full, counting the excess
    starts.settled(b, 1)  # the excess handed back
    await settle_tasks()
    assert [f.windows[-1] for f in (a, b, c)] == [1, 1, 1]
    assert [len(f.consumes) for f in (a, b, c)] == [2, 2, 2]


async def test_a_queue_whose_consumers_are_all_used_up_is_offered_a_free_worker_again() -> None:
    """Over several queues a channel cut to the pool's free workers cannot wait for a twentieth
    of its size: the queue's starts would wait while the pool has room. One channel per queue
    consumes again as soon as a slot comes back anywhere in the pool."""
    starts, (a, b, c) = await several_queues(workers=40)
    for tag in range(1, 39):
        starts.delivered(a, tag)
    await starts.place(Placement(priority=2, start_queues=3))  # b and c cut to 2
    assert b.windows[-1] == 2 and c.windows[-1] == 2
    starts.delivered(b, 1)
    starts.delivered(b, 2)  # the pool is full now; queue 1's one consumer used up
    starts.settled(a, 1)  # one observer of queue 0 stopped
    await settle_tasks()
    assert len(b.consumes) == 3 and b.windows[-1] == 1  # queue 1 is offered the free worker again
    assert len(c.consumes) == 2  # queue 2's consumer still has room: nothing to do


async def test_a_window_cut_then_used_up_while_workers_are_free_is_opened_again() -> None:
    """A consumer cut to the pool's free workers keeps that window while workers come free on
    other queues (their settles offer the free workers only to queues all of whose consumers
    are used up, and this one was not). Used up later by starts that came back to its queue (a
    service killed), it must consume again: no settle may ever come, and the starts would wait
    while the pool has free workers (seen in CI: 14 of 30 waited past 60 s with 14 free)."""
    starts, (a, b, c) = await several_queues(workers=10)
    for tag in range(1, 5):
        starts.delivered(a, tag)
        starts.delivered(b, tag)
    await starts.place(Placement(priority=2, start_queues=3))  # every queue cut to the 2 free
    assert a.windows[-1] == b.windows[-1] == c.windows[-1] == 2
    for tag in range(1, 5):
        starts.settled(b, tag)  # queue 1's starts moved away (ORCH_START_QUEUES lowered)
    await settle_tasks()
    assert await starts.release("default", "orch.start.default.1") is not None
    assert await starts.release("default", "orch.start.default.2") is not None

    starts.delivered(a, 5)
    starts.delivered(a, 6)  # a's window of 2 used up, 4 of the 10 workers still free
    await settle_tasks()
    assert a.windows[-1] == 4 and len(a.consumes) == 3


async def taken_up(size: int) -> tuple[StartConsumers, FakeChannel]:
    """A quorum queue's channel on RabbitMQ 4: its record is taken up at each consume."""
    starts = StartConsumers(quorum=True, placement=Placement())
    fake = FakeChannel()
    await starts.hold(
        cast(AbstractChannel, fake), cast(StartChannel, fake), "default", "q", size, size, takes_up_records=True
    )
    return starts, fake


async def test_a_record_taken_up_is_consumed_under_its_own_tag_with_what_it_holds_counted() -> None:
    starts, fake = await taken_up(size=4)
    for tag in (1, 2, 3):
        starts.delivered(fake, tag)

    await starts.place(Placement(priority=2))
    assert fake.tags == ["orch-start q"] * 2 and fake.cancelled == ["orch-start q"]
    assert fake.windows == [4, 4]  # the three it holds and the one slot left
    assert fake.consumes[-1]["x-priority"] == 2


async def test_a_record_taken_up_gets_its_slots_back_without_consuming_again() -> None:
    starts, fake = await taken_up(size=40)
    for tag in range(1, 21):
        starts.delivered(fake, tag)
    await starts.place(Placement(priority=2))
    for tag in range(1, 11):  # ten of the first consume's: the broker gives their credit back
        starts.settled(fake, tag)
    await settle_tasks()
    assert len(fake.consumes) == 2 and fake.windows == [40, 40]

    for tag in range(21, 51):  # the slots it got back are its own: thirty more fill it
        starts.delivered(fake, tag)
    assert starts.delivered(fake, 51) == "excess"


async def test_a_full_record_taken_up_consumes_again_at_the_first_slot_back() -> None:
    starts, fake = await taken_up(size=2)
    starts.delivered(fake, 1)
    starts.delivered(fake, 2)
    await starts.place(Placement(priority=2))
    assert len(fake.consumes) == 1  # full: cancelled, not consumed again

    starts.settled(fake, 1)
    await settle_tasks()
    assert fake.tags[-1] == "orch-start q" and fake.windows[-1] == 2  # the one held and the slot back


def test_an_emptied_placement_takes_starts_first_in_every_pool_unless_cordoned() -> None:
    """What a service consumes under once its session ended and fenced everything: UNDER in
    every pool (a per-pool OVER would keep its own starts away from it), the start queues kept;
    a cordon holds (a draining service takes nothing)."""
    placed = Placement(priority=OVER, pools=(("a", OVER), ("b", EVEN)), start_queues=3)
    emptied = placed.emptied()
    assert (emptied.priority_in("a"), emptied.priority_in("b"), emptied.start_queues) == (UNDER, UNDER, 3)
    cordoned = Placement(priority=OVER, cordoned=True)
    assert cordoned.emptied() == cordoned
