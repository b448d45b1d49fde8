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


@dataclass(frozen=True)
class Look:
    """One balance round's view of the queues past the first ``keep`` of each pool, taken
    once (``Retirement.look``) for all three steps: what each live service's last heartbeat
    says it holds from them, and, once none holds any, what the broker says of each."""

    keep: int
    in_use: int
    pools: tuple[str, ...]
    held: dict[uuid.UUID, QueueHeld]  # live services' last heartbeats
    past: dict[uuid.UUID, int]  # starts each holds past ``keep``
    consume_kept: bool  # every live service's placement heartbeat says it consumes ``keep`` queues
    # (ready, consumers) of each queue past ``keep`` (None: it does not exist); None when not
    # asked (a start held past them, a service not heard from) or the broker did not answer.
    uses: tuple[tuple[int, int] | None, ...] | None

    @property
    def held_past(self) -> bool:
        return any(self.past.values())


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

    async def look(self, fleet: list[planning.Member], pools: set[str], keep: int, in_use: int) -> Look:
        """This round's ``Look``; the services gone are forgotten."""
        alive = {m.id for m in fleet}
        for gone in [i for i in self.queue_held if i not in alive]:
            del self.queue_held[gone]
        self._asked = {i: at for i, at in self._asked.items() if i in alive}
        held = dict(self.queue_held)
        past = {i: sum(h.counts[keep:]) for i, h in held.items()}
        HELD_PAST_START_QUEUES.set(sum(past.values()))
        heard = [self.placements.get(m.id) for m in fleet]
        uses = None
        # A service not heard from since this manager started may hold starts past them.
        if in_use > keep and self.broker is not None and None not in heard and not any(past.values()):
            uses = await self._ask(sorted(pools), range(keep, in_use))
        return Look(
            keep=keep,
            in_use=in_use,
            pools=tuple(sorted(pools)),
            held=held,
            past=past,
            consume_kept=all(p is not None and p[1] == keep for p in heard),
            uses=uses,
        )

    async def _ask(self, pools: list[str], indexes: range) -> tuple[tuple[int, int] | None, ...] | None:
        assert self.broker is not None
        try:
            return tuple([await self.broker.probes.start_queue_use(pool, i) for pool in pools for i in indexes])
        except BrokerUnavailable:
            return None

    def told(self, look: Look) -> int:
        """How many start queues of each pool the services are to consume: all ``in_use``
        while any past the first ``keep`` holds a start, ready or held (step 2), or a service
        has not said yet what it holds (a manager's start)."""
        if look.in_use <= look.keep:
            return look.in_use
        if look.uses is None or any(use is not None and use[0] > 0 for use in look.uses):
            return look.in_use
        return look.keep

    async def delete_emptied(self, look: Look, now: float) -> bool:
        """Delete the queues past the first ``keep`` of each pool once nothing has been left in
        them and no service has consumed them for ``delete_after_s`` up to ``now`` (monotonic
        seconds; step 3); whether none is left."""
        if self.broker is None:
            return False
        if not self._unused(look):
            self._unused_since = None
            return False
        if self._unused_since is None:
            self._unused_since = now
            logger.info(
                "start queues past ORCH_START_QUEUES=%d are empty and unconsumed: deleted in %gs unless a start comes",
                look.keep,
                self.delete_after_s,
            )
        if now - self._unused_since < self.delete_after_s:
            return False
        probes = self.broker.probes
        try:
            for pool in look.pools:
                for index in reversed(range(look.keep, look.in_use)):
                    # Asked again at the moment of deleting: a quorum queue refuses the
                    # broker's own if-unused/if-empty check (``BrokerProbes.delete_start_queue``).
                    use = await probes.start_queue_use(pool, index)
                    if use is None:
                        continue
                    if use != (0, 0) or not await probes.delete_start_queue(pool, index):
                        self._unused_since = None
                        return False
                    logger.info(
                        "deleted start queue %d of pool %s: emptied, past ORCH_START_QUEUES=%d", index, pool, look.keep
                    )
        except BrokerUnavailable:
            return False
        self._unused_since = None
        return True

    @staticmethod
    def _unused(look: Look) -> bool:
        """Whether no live service holds or consumes a queue past the first ``keep`` of each
        pool, as their heartbeats say, and the broker found none of them holding a start or
        consumed."""
        if look.held_past or not look.consume_kept or look.uses is None:
            return False
        return all(use is None or use == (0, 0) for use in look.uses)

    async def round(
        self,
        fleet: list[planning.Member],
        look: Look,
        budget: int,
        publish: Callable[[RetireStarts, str], Awaitable[bool]],
    ) -> int:
        """Ask the services holding starts from queues past the first ``keep`` to move at most
        ``budget`` of them (step 1); how many were asked."""
        asked = 0
        for m in fleet:
            held = look.held.get(m.id)
            if budget - asked <= 0 or held is None or held.session_id is None or look.past[m.id] <= 0:
                continue
            if self._asked.get(m.id) == held.heard_at:
                continue  # moving what it was asked for; its next heartbeat says what is left
            count = min(look.past[m.id], budget - asked)
            ask = RetireStarts(service_id=m.id, session_id=held.session_id, keep=look.keep, count=count)
            if await publish(ask, m.name):
                self._asked[m.id] = held.heard_at
                asked += count
                logger.info(
                    "start queues past %d: %s moves %d of the %d start(s) it holds from them",
                    look.keep,
                    m.name,
                    count,
                    look.past[m.id],
                )
        STARTS_RETIRED.inc(asked)
        return asked
