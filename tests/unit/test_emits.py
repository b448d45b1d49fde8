"""``observer_service.emits``: emit slots serve waiters in order and stay cheap when waiters
give up."""

from __future__ import annotations

import asyncio
import time

from observer_service.emits import Slots


async def test_emit_slots_serve_waiters_in_order_and_skip_the_cancelled() -> None:
    slots = Slots(2)
    served: list[int] = []

    async def emit(n: int) -> None:
        await slots.acquire()
        served.append(n)

    await slots.acquire()
    await slots.acquire()
    assert slots.full()
    waiting = [asyncio.create_task(emit(n)) for n in range(4)]
    await asyncio.sleep(0)
    waiting[1].cancel()  # gives up while it waits: its turn is skipped
    await asyncio.sleep(0)
    slots.release()  # both of ours: to 0 and 2
    slots.release()
    slots.release()  # 0's: to 3
    await asyncio.gather(*waiting, return_exceptions=True)
    assert served == [0, 2, 3]
    # A waiter handed a slot as it is cancelled passes the slot on: none is lost.
    late = asyncio.create_task(emit(9))
    await asyncio.sleep(0)
    slots.release()  # 2's: to the late one, which is cancelled before it runs
    late.cancel()
    await asyncio.gather(late, return_exceptions=True)
    assert served == [0, 2, 3] and not slots.full()
    slots.release()  # 3's: both slots free again
    for _ in range(2):
        await asyncio.wait_for(slots.acquire(), 1)
    assert slots.full()


async def test_emit_slots_stay_cheap_when_waiters_deep_in_the_queue_give_up() -> None:
    """A stop or a fence cancels observers by the ten thousand while hundreds of thousands
    wait for an emit slot, in no particular order. asyncio.Semaphore (3.11) removes each
    cancelled waiter from its deque by value: 20,000 of 200,000 cancelled from the back
    keep the loop busy for over two minutes here (141 s), and the service's
    publishing connection silent with it (make bench-scale, 1,000,000 emitting). Here a
    cancelled turn is skipped when it comes."""
    slots = Slots(1)
    await slots.acquire()
    waiting = [asyncio.create_task(slots.acquire()) for _ in range(200_000)]
    await asyncio.sleep(0)
    given_up = waiting[::-1][:20_000]
    began = time.monotonic()
    for task in given_up:
        task.cancel()
    await asyncio.gather(*given_up, return_exceptions=True)
    # A generous bound (it takes well under a second): the loop runs every cancelled
    # waiter's cleanup in one pass, so a timeout could not even fire before they are done.
    assert time.monotonic() - began < 30, "cancelled emit waiters held the event loop"
    for _ in range(180_000):
        slots.release()  # each to the next live waiter, in order
    await asyncio.wait_for(asyncio.gather(*waiting[:180_000]), 30)
    assert slots.full()
    slots.release()  # skips the 20,000 given up: the slot is free
    assert not slots.full()
