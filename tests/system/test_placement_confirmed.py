"""A service confirms a new placement by a heartbeat as soon as its consumers take it, not at
its next periodic one: the balancer hands nothing over in a pool until its services confirm
(``manager/balance/rounds.py``), so a hand-over never races a taker consuming again."""

from __future__ import annotations

import asyncio
import time

from aio_pika.abc import AbstractQueue

from manager.broker import BrokerLink
from manager.settings import ManagerSettings
from observer_service.service import ObserverService
from observer_service.settings import ServiceSettings
from shared.messages import ServiceHeartbeat, SetPlacement, decode_state
from tools import infra


async def _heartbeats(state_queue: AbstractQueue, within_s: float) -> list[ServiceHeartbeat]:
    """The heartbeats that reach the state queue within ``within_s``, or until a second after
    the first one."""
    found: list[ServiceHeartbeat] = []
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        message = await state_queue.get(no_ack=True, fail=False)
        if message is None:
            await asyncio.sleep(0.05)
        elif isinstance(report := decode_state(message.body), ServiceHeartbeat):
            deadline = min(deadline, time.monotonic() + 1.0) if not found else deadline
            found.append(report)
    return found


async def test_a_new_placement_is_confirmed_by_a_heartbeat_at_once(
    rabbit: infra.RabbitNode, vhost: str, state_queue: AbstractQueue
) -> None:
    # Periodic heartbeats an hour apart: any heartbeat seen here was sent for the placement
    settings = ServiceSettings(
        amqp_url=rabbit.url_for(vhost), workers_count=5, service_name="confirms", heartbeat_s=3600, metrics_port=0
    )
    service = ObserverService(settings)
    link = BrokerLink(ManagerSettings(amqp_url=rabbit.url_for(vhost)))
    link.start()
    running = asyncio.create_task(service.run())
    try:
        await asyncio.wait_for(link.ready.wait(), 30)
        deadline = time.monotonic() + 30
        while service.session is None or service.session.placement is None:
            assert time.monotonic() < deadline, "no session opened"
            await asyncio.sleep(0.05)
        assert await _heartbeats(state_queue, 1.0) == []

        await link.publish_control(
            SetPlacement(service_id=service.service_id, priority=2, cordoned=False, pools={}, start_queues=1)
        )
        beats = await _heartbeats(state_queue, 10.0)
        assert [(b.priority, b.cordoned) for b in beats] == [(2, False)], beats

        # A cordon, likewise: it is a placement too
        await link.publish_control(
            SetPlacement(service_id=service.service_id, priority=2, cordoned=True, pools={}, start_queues=1)
        )
        beats = await _heartbeats(state_queue, 10.0)
        assert [(b.priority, b.cordoned) for b in beats] == [(2, True)], beats
    finally:
        service.shutdown.set()
        await asyncio.wait_for(running, 30)
        await link.close()
