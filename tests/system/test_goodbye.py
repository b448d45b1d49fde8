"""A service's goodbye (``ServiceStopped``) is the last report it sends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aio_pika.abc import AbstractQueue

from observer_service.service import ObserverService
from observer_service.session import Session
from observer_service.settings import ServiceSettings
from shared.messages import ServiceStopped, decode_state
from tools import infra


async def test_nothing_follows_a_services_goodbye(
    rabbit: infra.RabbitNode, vhost: str, state_queue: AbstractQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI once: a heartbeat and a digest queued while the goodbye was being confirmed reached
    the manager after it; the row was deleted by then, so the manager took the service for one
    replaced by a namesake ("was replaced by another one born under its name but still runs")
    and asked it to take another name. Here its session takes a while to close, as on a busy
    machine, and heartbeats and digests are due all the time."""
    settings = ServiceSettings(
        amqp_url=rabbit.url_for(vhost),
        workers_count=5,
        service_name="bye",
        heartbeat_s=0.05,
        inventory_s=0.05,
        metrics_port=0,
    )
    service = ObserverService(settings)
    real_close = Session.close

    async def slow_close(self: Session, *args: Any) -> None:
        await asyncio.sleep(0.5)
        await real_close(self, *args)

    monkeypatch.setattr(Session, "close", slow_close)
    running = asyncio.create_task(service.run())
    await asyncio.sleep(1.0)  # open, born, beating
    service.shutdown.set()
    await asyncio.wait_for(running, 30)
    kinds = []
    while (message := await state_queue.get(no_ack=True, fail=False)) is not None:
        kinds.append(type(decode_state(message.body)).__name__)
    assert ServiceStopped.__name__ in kinds, kinds
    assert kinds[-1] == ServiceStopped.__name__, kinds[kinds.index(ServiceStopped.__name__) :]
