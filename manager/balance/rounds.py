"""The balancer's round: each round it evens the load of the fleet and drains what an operator
asked to drain (docs/design.md, "Even load"), by the decisions of ``plan.py``. The state side's
loop runs it after the repairs (``manager/repairs/loop.py``), on the leader only.

* It tells each service its placement (``SetPlacement``: a consumer priority, or a cordon)
  whenever that changes, and again while the service's heartbeats report another one.
* It asks over and draining services to hand observers over (``StopObservers`` with
  ``hand_over``): each ends its copy first, then gives the start back to its queue, and the
  broker gives it to the highest priority with a free worker, so an observer never runs
  twice and is not running only for the moment the broker takes to deliver it again.
* A pool where a placement changed, or where a service has not yet confirmed the last one
  sent (its heartbeat, sent at once once it consumes under it), moves nothing that round:
  its services consume under the new priorities first, or the starts would go where the old
  ones point, or to the one service of a queue whose other taker is between its cancel and
  its consume. The other pools move as usual, and a pool held ``SETTLE_ROUNDS`` rounds
  running moves the next whatever is unsettled in it then (``Settle``): drains and uncordons
  flapping, or a service that never confirms, would otherwise hold it still.
* A pool is not evened while a drain's hand-overs land, nor while the broker holds one of its
  starts for an ended session (after a node's death, until the queue hands it on); drains
  still move. Nor by a difference its starts in flight could make up (``plan.py``).
* The round's budget (``ORCH_BALANCE_MOVES_PER_S`` times the period) is spent on what is
  asked to move, drains first: a planned move of observers that cannot go (pinned, of a kind
  no taker runs) takes nothing from the others. What is left moves starts off the start
  queues past ``ORCH_START_QUEUES`` once it was lowered (``retire.py``).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.balance import fleet as fleet_rows
from manager.balance import plan as planning
from manager.balance.handovers import Handovers
from manager.balance.plan import Placed
from manager.balance.retire import QueueHeld, Retirement
from manager.broker import BrokerLink
from manager.metrics import FLEET_IMBALANCE, HANDOVERS
from manager.settings import ManagerSettings
from shared.errors import BrokerUnavailable
from shared.messages import STOPS_PER_MESSAGE, RetireStarts, SetPlacement, StopObservers
from shared.topology import BROKER_HOLDS_AT_MOST_S

logger = logging.getLogger(__name__)

_RESEND_AFTER_S = 10.0  # a placement a service's heartbeats do not confirm is sent again
# A pool waits at most this many rounds running for its placements to settle: seconds on the
# default period, enough for joins and a drain in consecutive rounds (docs/design.md).
SETTLE_ROUNDS = 5
# A pool with a start the broker holds for a dead session is not evened (``run``), for at
# most this long from the row's mark: past it the lost-start repair publishes it again.
_AWAITING_AT_MOST = timedelta(seconds=BROKER_HOLDS_AT_MOST_S)
# A start published this long ago and still not running is waiting, not on its way
# (``fleet.in_flight``): in a create of 1,000,000 here the last ran 0.1 s after the last was
# accepted (docs/broker-versions.md).
_IN_FLIGHT_AT_MOST = timedelta(seconds=60)
_ASK_QUEUES_EVERY_S = 60.0  # how often the start queues a larger ORCH_START_QUEUES left are asked for


class Settle:
    """The pools that move nothing this round because a placement in them is unsettled; never
    the same pool more than ``rounds`` rounds running, so that a pool whose placements change
    every round (drain and uncordon requests flapping) still moves every ``rounds + 1``-th."""

    def __init__(self, rounds: int = SETTLE_ROUNDS) -> None:
        self._rounds = rounds
        self._running: dict[str, int] = {}  # pool: the rounds it has been held in a row

    def held(self, unsettled: set[str]) -> set[str]:
        held = {pool for pool in unsettled if self._running.get(pool, 0) < self._rounds}
        self._running = {pool: self._running.get(pool, 0) + 1 for pool in held}
        return held


class BalanceRound:
    """Run by the repair loop as a repair is (``manager/repairs/base.py``), though it mends
    nothing: ``handovers`` and ``placements`` are the state side's memory of the hand-overs
    asked and of the placement each service's heartbeats report (``StateContext``)."""

    name = "balance"

    def __init__(
        self,
        settings: ManagerSettings,
        sessions: async_sessionmaker[AsyncSession],
        broker: BrokerLink,
        handovers: Handovers,
        placements: dict[uuid.UUID, tuple[Placed, int]],
        queue_held: dict[uuid.UUID, QueueHeld] | None = None,
    ) -> None:
        self.sessions = sessions
        self.broker = broker
        self.handovers = handovers
        self.placements = placements
        self.tolerance = settings.balance_tolerance
        self.moves_per_s = settings.balance_moves_per_s
        self.period_s = settings.repair_interval_s
        self._sent: dict[uuid.UUID, tuple[tuple[Placed, int], float]] = {}  # placement, start queues; when
        self._refused: set[str] = set()  # services a command could not reach, said once
        self._settle = Settle()
        # Start queues each service is told to consume: ``ORCH_START_QUEUES``, or all that exist
        # (asked every minute: ``in_use``) while those past it are emptied (``retire.py``).
        self.configured_queues = self.start_queues = self.in_use = settings.start_queues
        self._queues_asked_at = -math.inf
        self.retirement = Retirement(
            {} if queue_held is None else queue_held, placements, broker, settings.start_queue_delete_after_s
        )

    async def run(self) -> None:
        async with self.sessions.begin() as session:
            fleet, notes = await fleet_rows.members(session, self.handovers.busy())
            awaiting = await fleet_rows.awaiting_broker(session, datetime.now(UTC) - _AWAITING_AT_MOST)
            in_flight = await fleet_rows.in_flight(session, datetime.now(UTC) - _IN_FLIGHT_AT_MOST)
        decided = planning.plan(fleet, self.tolerance, in_flight)
        FLEET_IMBALANCE.set(decided.imbalance)
        pools = {pool for m in fleet for pool in m.pools}
        await self._ask_start_queues(pools)
        look = await self.retirement.look(fleet, pools, self.configured_queues, self.in_use)
        self.start_queues = self.retirement.told(look)
        placed = await self._place(fleet, decided)
        changed = {i: note for i, note in decided.drain_notes.items() if notes.get(i) != note}
        if changed:
            async with self.sessions.begin() as session:
                await fleet_rows.set_drain_notes(session, changed)
        unsettled = placed | {m.id for m in fleet if not self._confirmed(m.id)}
        waiting = self._settle.held({pool for m in fleet if m.id in unsettled for pool in m.pools})
        names = {m.id: m.name for m in fleet}
        budget = math.ceil(self.moves_per_s * self.period_s)
        # A pool whose drain hands observers over this round, or is still landing, is not
        # evened: the plan counts none of what is on its way to the takers, and the broker
        # gives it to the emptiest first, so evening now overshoots and moves them back later.
        landing = {pool for m in fleet if m.draining and m.busy for pool in m.pools}
        # Nor a pool whose starts the broker holds for a dead session: after a node's death its
        # service comes back empty, and its starts return to it (the emptiest, priority 2)
        # once the queue lets the session go; evening before that moves observers that run
        # fine on the others, a second interruption on top of the failover.
        landing |= awaiting
        for move in decided.moves:  # drains first
            if budget <= 0:
                break
            if move.pool in waiting or (move.reason != "drain" and move.pool in landing):
                continue
            asked = await self._hand_over(replace(move, count=min(move.count, budget)), names[move.source])
            budget -= asked
            if asked and move.reason == "drain":
                landing.add(move.pool)
        # Last, with what is left: emptying the queues past ORCH_START_QUEUES can wait.
        await self.retirement.round(fleet, look, budget, self._publish)
        if self.start_queues < self.in_use and await self.retirement.delete_emptied(look, time.monotonic()):
            self.in_use = self.broker.start_queues_in_use = self.configured_queues

    async def _ask_start_queues(self, pools: set[str]) -> None:
        """Declare the pools' start queues before any service is told of them (the manager
        spreads their leaders: ``BrokerLink.declare_start_queues``), and every minute ask how
        many exist."""
        try:
            for pool in sorted(pools):
                await self.broker.declare_start_queues(pool)  # once per connection
            if time.monotonic() - self._queues_asked_at < _ASK_QUEUES_EVERY_S:
                return
            counts = [self.configured_queues]
            for pool in sorted(pools):
                counts.append(await self.broker.probes.start_queues_in_use(pool, self.configured_queues))
        except BrokerUnavailable:
            return  # asked again next round
        self._queues_asked_at = time.monotonic()
        if max(counts) != self.in_use:
            logger.info(
                "start queues per pool: services consume %d (ORCH_START_QUEUES=%d%s)",
                max(counts),
                self.configured_queues,
                "; the queues past it stay consumed until their starts are moved into the first ones, then deleted"
                if max(counts) > self.configured_queues
                else "",
            )
        self.in_use = self.broker.start_queues_in_use = max(counts)

    async def _place(self, fleet: list[planning.Member], decided: planning.Plan) -> set[uuid.UUID]:
        """Send each placement that changed, or that heartbeats still contradict after a
        while; the services whose placement changed."""
        changed = set()
        now = time.monotonic()
        alive = {m.id for m in fleet}
        self._sent = {i: sent for i, sent in self._sent.items() if i in alive}
        for m in fleet:
            placed = planning.placement(decided, m.id)
            want = (placed, self.start_queues)
            sent = self._sent.get(m.id)
            if sent is not None and sent[0] == want:
                if self.placements.get(m.id, want) == want or now - sent[1] < _RESEND_AFTER_S:
                    continue
            elif sent is None or sent[0][0] != placed:
                changed.add(m.id)
            self._sent[m.id] = (want, now)  # sent or not: resent while heartbeats disagree
            priority, cordoned, pools = placed
            placement = SetPlacement(
                service_id=m.id,
                priority=priority,
                cordoned=cordoned,
                pools=dict(pools),
                start_queues=self.start_queues,
            )
            await self._publish(placement, m.name)
        return changed

    def _confirmed(self, service_id: uuid.UUID) -> bool:
        """Whether the service's heartbeats say it consumes under the placement last sent (one
        not heard from yet counts as confirmed: the cap holds its pools at most a while)."""
        sent = self._sent.get(service_id)
        return sent is None or self.placements.get(service_id, sent[0]) == sent[0]

    async def _publish(self, message: SetPlacement | StopObservers | RetireStarts, name: str) -> bool:
        """Send a command to one service. One the broker refuses (its control queue is on a
        node that is down, until its next session) stops neither the round nor the others."""
        try:
            await self.broker.publish_control(message)
        except BrokerUnavailable as e:
            if name not in self._refused:
                logger.warning("balance: cannot reach service %s now (%s); trying again later", name, e)
            self._refused.add(name)
            return False
        self._refused.discard(name)
        return True

    async def _hand_over(self, move: planning.Move, name: str) -> int:
        """Ask ``move``'s source to hand over what may move of it; how many it was asked."""
        async with self.sessions.begin() as session:
            chosen = await fleet_rows.movable(session, move)
        by_session: dict[uuid.UUID | None, list[uuid.UUID]] = {}
        asked = 0
        for observer_id, session_id in chosen:
            by_session.setdefault(session_id, []).append(observer_id)
        for session_id, ids in by_session.items():
            for i in range(0, len(ids), STOPS_PER_MESSAGE):
                part = ids[i : i + STOPS_PER_MESSAGE]
                hand_over = StopObservers(
                    observer_ids=part, service_id=move.source, session_id=session_id, reason=move.reason, hand_over=True
                )
                # Remembered before it is sent: the start elsewhere may be applied before the
                # confirm of this publish is back.
                self.handovers.asked(move.source, part, move.reason)
                if await self._publish(hand_over, name):
                    asked += len(part)
                else:
                    self.handovers.forget(part)
        if asked:
            HANDOVERS.labels(move.reason).inc(asked)
            logger.info("%s: %s hands %d observer(s) of pool %s over", move.reason, name, asked, move.pool)
        return asked
