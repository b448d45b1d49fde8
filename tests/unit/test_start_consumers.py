"""``observer_service.start_consumers``: each consumer is opened with the window its channel has
left, and consumes again once enough of what it held before was settled (a new consumer's
prefetch does not count what the cancelled one holds: ``tests/system/test_consumer_priority.py``)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from aio_pika.abc import AbstractChannel

from observer_service.start_channel import StartChannel
from observer_service.start_consumers import Placement, StartConsumers


class FakeChannel:
    """Records the prefetch windows set and the consumes and cancels made on one channel."""

    def __init__(self) -> None:
        self.windows: list[int] = []
        self.consumes: list[dict[str, Any]] = []
        self.cancelled: list[str] = []

    async def set_qos(self, prefetch_count: int) -> None:
        self.windows.append(prefetch_count)

    async def consume(self, queue: str, arguments: dict[str, Any]) -> str:
        self.consumes.append(arguments)
        return f"tag-{len(self.consumes)}"

    async def basic_cancel(self, tag: str) -> None:
        self.cancelled.append(tag)


async def held_by(size: int) -> tuple[StartConsumers, FakeChannel]:
    starts = StartConsumers(quorum=False, placement=Placement())
    fake = FakeChannel()
    await starts.hold(cast(AbstractChannel, fake), cast(StartChannel, fake), "default", size)
    return starts, fake


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

    await starts.step_aside("orch.start.default", 0.2)
    assert fake.consumes[-1] == {"x-priority": -1}
    assert starts.delivered(fake, 2)  # came to the consumer stepped aside
    await starts.step_aside("orch.start.default", 0.3)  # extended: no new consume
    assert len(fake.consumes) == 3

    await asyncio.sleep(0.2)
    assert fake.consumes[-1] == {"x-priority": -1}  # still aside: the second step extended it
    await asyncio.sleep(0.2)
    assert fake.consumes[-1] == {"x-priority": 2} and len(fake.consumes) == 4
    assert not starts.delivered(fake, 3)


async def test_a_cordoned_service_steps_aside_without_consuming() -> None:
    starts, fake = await held_by(size=4)
    await starts.place(Placement(cordoned=True))
    await starts.step_aside("orch.start.default", 0.05)
    await asyncio.sleep(0.1)
    assert len(fake.consumes) == 1  # the first, before the cordon
