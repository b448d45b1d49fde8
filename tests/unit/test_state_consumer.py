"""``manager.state.consumer``: acks of a closed channel, and the next batch applied while the
last one's follow-ups are published."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from aiormq.exceptions import ChannelInvalidStateError

from manager.state.consumer import StateConsumer
from manager.state.follow_ups import FollowUps
from shared.messages import (
    ServiceHeartbeat,
)


async def test_acking_state_messages_whose_channel_closed_meanwhile_does_not_raise() -> None:
    # aio-pika's message.channel raises once its channel is closed; the consumer must carry
    # on (the broker redelivers them, and they are skipped as applied before).
    class ClosedChannelMessage:
        @property
        def channel(self) -> object:
            raise ChannelInvalidStateError

        async def ack(self, multiple: bool = False) -> None:
            raise AssertionError("nothing to ack on a closed channel")

    report = ServiceHeartbeat(service_id=uuid.uuid4(), running=0)
    await StateConsumer._ack([(ClosedChannelMessage(), report)] * 2)  # type: ignore[list-item]


async def test_state_consumer_applies_the_next_batch_while_the_last_ones_follow_ups_are_published() -> None:
    # Publishing a batch's follow-ups waits for the broker's confirms; the next transaction
    # must not wait for them, yet each batch is acked only after its own follow-ups went out,
    # and batches are published and acked in the order they committed.
    log: list[str] = []
    first_published = asyncio.Event()
    release_first = asyncio.Event()

    class Message:
        def __init__(self, name: str) -> None:
            self.name = name
            self.channel = "the channel"

        async def ack(self, multiple: bool = False) -> None:
            log.append(f"ack {self.name}")

    consumer = StateConsumer(None, None, None)  # type: ignore[arg-type]

    async def transaction(reports: list[object]) -> FollowUps:
        name = reports[0].service_id.hex[:4]  # type: ignore[attr-defined]
        log.append(f"apply {name}")
        out = FollowUps()
        out.introduce(reports[0].service_id)  # type: ignore[attr-defined]
        return out

    async def publish(follow_ups: FollowUps) -> None:
        name = follow_ups.messages[0].service_id.hex[:4]  # type: ignore[attr-defined]
        log.append(f"publish {name}")
        if name == "aaaa":
            first_published.set()
            await release_first.wait()

    consumer._transaction = transaction  # type: ignore[method-assign,assignment]
    consumer._publish = publish  # type: ignore[method-assign]
    run = asyncio.create_task(consumer.run())
    try:
        for name in ("aaaa", "bbbb"):
            report = ServiceHeartbeat(service_id=uuid.UUID(name * 8), running=0)
            consumer._inbox.put_nowait((Message(name), report))  # type: ignore[arg-type]
            if name == "aaaa":
                await asyncio.wait_for(first_published.wait(), 5)
        for _ in range(100):
            if "apply bbbb" in log:
                break
            await asyncio.sleep(0.01)
        assert log == ["apply aaaa", "publish aaaa", "apply bbbb"]  # applied while aaaa's publish waits
        assert not consumer.idle()
        release_first.set()
        for _ in range(100):
            if consumer.idle():
                break
            await asyncio.sleep(0.01)
        assert log == ["apply aaaa", "publish aaaa", "apply bbbb", "ack aaaa", "publish bbbb", "ack bbbb"]
        assert consumer.idle()
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
