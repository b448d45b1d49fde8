"""Emptying and deleting the start queues past ``ORCH_START_QUEUES`` once it was lowered
(docs/design.md, "A pool over several start queues").

The manager publishes no start to such a queue any more, but starts wait in it, ready or held
by a service, so until it is empty the services keep consuming it. Three steps, each round
of the balancer, none before the one above it holds:

1. **Move.** The heartbeats count the starts each service holds from each queue index
   (``ServiceHeartbeat.queue_held``). A service that holds some from a queue past the
   setting is asked to move them (``RetireStarts``), within what is left of the round's
   moves: it ends each observer, acks its start and says ``StartsGone``, and the manager
   publishes it again to its queue under the setting (``observer_service/retire.py``). A
   service is asked once per heartbeat; it sends the next at once after moving.
2. **Stop consuming.** Once no service holds a start from them and none waits in them (a
   passive declare of each), the services are told the setting itself (``told``): each
   stops consuming the queues past it from which it holds nothing.
3. **Delete.** Once every live service's heartbeat says it consumes that many and holds
   nothing past them, and each queue has neither a start nor a consumer (on a quorum queue
   that count includes a cancelled consumer still holding deliveries), and that has held for
   ``ORCH_START_QUEUE_DELETE_AFTER_S`` (a manager not restarted with the lowered setting yet
   still publishes to them), they are deleted, the last first (the queues are numbered
   without gaps). Until then anything that turns up in one (a start such a manager
   published, or one a service's death handed back) makes the services consume the queues
   again, and its starts are moved.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from manager.balance import plan as planning
from manager.balance.plan import Placed
from manager.metrics import HELD_PAST_START_QUEUES, STARTS_RETIRED
from shared.errors import BrokerUnavailable
from shared.messages import RetireStarts

if TYPE_CHECKING:
    from manager.broker import BrokerLink

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueHeld:
    """What a service's last heartbeat said it holds from each start queue index."""

    session_id: uuid.UUID | None
    counts: tuple[int, ...]
    heard_at: float  # ``time.monotonic`` when it was applied


class Retirement:
    def __init__(
        self,
        queue_held: dict[uuid.UUID, QueueHeld],
        placements: dict[uuid.UUID, tuple[Placed, int]],
        broker: BrokerLink | None = None,
        delete_after_s: float = 0.0,
    ) -> None:
        # The state side's, from the heartbeats (``StateContext``).
        self.queue_held = queue_held
        self.placements = placements
        self.broker = broker  # its probes ask about and delete the start queues
        self._asked: dict[uuid.UUID, float] = {}  # service: ``heard_at`` of the heartbeat it was asked from
        self.delete_after_s = delete_after_s  # ``ORCH_START_QUEUE_DELETE_AFTER_S``
        self._unused_since: float | None = None  # since when step 3's conditions have held

    def _past(self, fleet: list[planning.Member], keep: int) -> dict[uuid.UUID, int]:
        """Each live service's starts held from queues past the first ``keep``, by its last heartbeat."""
        alive = {m.id for m in fleet}
        for gone in [i for i in self.queue_held if i not in alive]:
            del self.queue_held[gone]
        self._asked = {i: at for i, at in self._asked.items() if i in alive}
        past = {i: sum(held.counts[keep:]) for i, held in self.queue_held.items()}
        HELD_PAST_START_QUEUES.set(sum(past.values()))
        return past

    async def told(self, fleet: list[planning.Member], pools: set[str], keep: int, in_use: int) -> int:
        """How many start queues of each pool the services are to consume: all ``in_use``
        while any past the first ``keep`` holds a start, ready or held (step 2)."""
        if in_use <= keep or self.broker is None or any(m.id not in self.placements for m in fleet):
            return in_use  # nothing past the setting, or a service not heard from yet (a manager's start)
        if any(self._past(fleet, keep).values()):
            return in_use
        try:
            for pool in sorted(pools):
                for index in range(keep, in_use):
                    use = await self.broker.probes.start_queue_use(pool, index)
                    if use is not None and use[0] > 0:
                        return in_use
        except BrokerUnavailable:
            return in_use
        return keep

    async def delete_emptied(
        self, fleet: list[planning.Member], pools: set[str], keep: int, in_use: int, now: float
    ) -> bool:
        """Delete the queues past the first ``keep`` of each pool once nothing has been left in
        them and no service has consumed them for ``delete_after_s`` up to ``now`` (monotonic
        seconds; step 3); whether none is left."""
        if self.broker is None:
            return False
        if not await self._unused(fleet, pools, keep, in_use):
            self._unused_since = None
            return False
        if self._unused_since is None:
            self._unused_since = now
            logger.info(
                "start queues past ORCH_START_QUEUES=%d are empty and unconsumed: deleted in %gs unless a start comes",
                keep,
                self.delete_after_s,
            )
        if now - self._unused_since < self.delete_after_s:
            return False
        probes = self.broker.probes
        try:
            for pool in sorted(pools):
                for index in reversed(range(keep, in_use)):
                    use = await probes.start_queue_use(pool, index)
                    if use is None:
                        continue
                    if use != (0, 0) or not await probes.delete_start_queue(pool, index):
                        self._unused_since = None
                        return False
                    logger.info(
                        "deleted start queue %d of pool %s: emptied, past ORCH_START_QUEUES=%d", index, pool, keep
                    )
        except BrokerUnavailable:
            return False
        self._unused_since = None
        return True

    async def _unused(self, fleet: list[planning.Member], pools: set[str], keep: int, in_use: int) -> bool:
        """Whether no live service holds or consumes a queue past the first ``keep`` of each
        pool, as their heartbeats say, and the broker finds none of them holding a start or
        consumed."""
        assert self.broker is not None
        if any(self._past(fleet, keep).values()) or any(self.placements.get(m.id, (None, 0))[1] != keep for m in fleet):
            return False  # a service still holds or consumes them, or has not said so yet
        try:
            for pool in sorted(pools):
                for index in range(keep, in_use):
                    use = await self.broker.probes.start_queue_use(pool, index)
                    if use is not None and use != (0, 0):
                        return False
        except BrokerUnavailable:
            return False
        return True

    async def round(
        self,
        fleet: list[planning.Member],
        keep: int,
        budget: int,
        publish: Callable[[RetireStarts, str], Awaitable[bool]],
    ) -> int:
        """Ask the services holding starts from queues past the first ``keep`` to move at most
        ``budget`` of them (step 1); how many were asked."""
        past = self._past(fleet, keep)
        asked = 0
        for m in fleet:
            held = self.queue_held.get(m.id)
            if budget - asked <= 0 or held is None or held.session_id is None or past[m.id] <= 0:
                continue
            if self._asked.get(m.id) == held.heard_at:
                continue  # moving what it was asked for; its next heartbeat says what is left
            count = min(past[m.id], budget - asked)
            if await publish(RetireStarts(service_id=m.id, session_id=held.session_id, keep=keep, count=count), m.name):
                self._asked[m.id] = held.heard_at
                asked += count
                logger.info(
                    "start queues past %d: %s moves %d of the %d start(s) it holds from them",
                    keep,
                    m.name,
                    count,
                    past[m.id],
                )
        STARTS_RETIRED.inc(asked)
        return asked
