"""``observer_service.loop_thread``: a mailbox runs calls posted from other threads in order on
its loop."""

from __future__ import annotations

import asyncio
import threading

from observer_service.loop_thread import Mailbox


async def test_a_mailbox_runs_calls_from_other_threads_in_order_on_its_loop() -> None:
    mailbox = Mailbox(asyncio.get_running_loop())
    ran: list[tuple[int, int, bool]] = []
    main = threading.get_ident()

    def record(sender: int, n: int) -> None:
        ran.append((sender, n, threading.get_ident() == main))

    def send(sender: int) -> None:
        for n in range(5_000):
            mailbox.post(record, sender, n)

    senders = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for sender in senders:
        sender.start()
    for sender in senders:
        await asyncio.to_thread(sender.join)
    await asyncio.sleep(0.1)
    assert len(ran) == 15_000 and all(on_main for _, _, on_main in ran)
    for i in range(3):
        assert [n for s, n, _ in ran if s == i] == list(range(5_000))
