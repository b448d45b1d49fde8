"""Starts this service cannot run, handed on to a service that can (docs/design.md, "Starts a
service cannot run").

A start may name a kind this service lacks (a plug-in installed on other services only), or
need a child process while every process slot here is taken. Handed straight back, it would
come straight back: the broker gives a start to the highest consumer priority with a free
worker, and the service that declines it is often the emptiest, for as long as the others'
load is pinned. So the service first steps aside from that pool's queue
(``StartConsumers.step_aside``: below every other service, for ``ASIDE_S`` after its last
decline), then hands the start back, and the broker gives it to another service with a free
worker; one that cannot run it either steps aside in turn. A start that reaches a service
while it stands aside came because no other service had a free worker for it: it is held
``HOLD_S`` before it is handed back again, so a start that nobody can run now waits without
spinning, and runs once a service that can has room.

Every decline is reported (``StartsDeclined``): the manager says in the observer's history why
it waits, and publishes no second copy of a start that is held or on its way.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, Literal

from observer_service import metrics
from observer_service.inbox import Delivery
from observer_service.outbox import Outbox
from observer_service.settle import settle
from shared.messages import DECLINED_HOLD_S, StartsDeclined

logger = logging.getLogger(__name__)

ASIDE_S = 2.0
HOLD_S = DECLINED_HOLD_S

Why = Literal["kind", "process slot"]  # what this service lacks: the metric's label


class Declines:
    def __init__(
        self, service_id: uuid.UUID, outbox: Outbox, spawn: Callable[[Coroutine[Any, Any, None]], None]
    ) -> None:
        self.service_id = service_id
        self.outbox = outbox
        self.spawn = spawn
        # Declines not reported yet, by reason and whether they came back: one report and one
        # log line per burst of admissions, not one per start.
        self._unreported: dict[tuple[str, bool], list[uuid.UUID]] = {}

    def decline(self, delivery: Delivery, observer_id: uuid.UUID, pool: str, why: Why, reason: str) -> None:
        """Hand ``delivery`` on to another service of ``pool``, and say why (``reason``)."""
        metrics.STARTS_DECLINED.labels(why).inc()
        if not self._unreported:
            asyncio.get_running_loop().call_soon(self._report)
        self._unreported.setdefault((reason, delivery.aside), []).append(observer_id)
        self.spawn(self._hand_on(delivery, pool))

    def _report(self) -> None:
        by_reason: dict[str, list[uuid.UUID]] = {}
        for (reason, aside), ids in self._unreported.items():
            by_reason.setdefault(reason, []).extend(ids)
            if aside:
                logger.warning(
                    "%d start(s) came back (e.g. observer %s: %s): no other service can take them now; "
                    "handing them back in %.0fs",
                    len(ids),
                    ids[0],
                    reason,
                    HOLD_S,
                )
            else:
                logger.info("handing %d start(s) on to other services (e.g. observer %s: %s)", len(ids), ids[0], reason)
        for reason, ids in by_reason.items():
            self.outbox.put(StartsDeclined(service_id=self.service_id, observer_ids=ids, reason=reason))
        self._unreported = {}

    async def _hand_on(self, delivery: Delivery, pool: str) -> None:
        session = delivery.session
        if delivery.aside:
            await asyncio.sleep(HOLD_S)  # no other service had room for it: do not spin
        await session.step_aside(pool, ASIDE_S)
        await settle(session.requeue(delivery.channel, delivery.tag))
