"""What the balancer decides in one round, from the fleet as the rows say it (pure logic).

Each service's fair share of a pool is its capacity times the pool's load factor (observers
over workers of the services that take starts); shares are relative to capacity, so services
of different sizes are even when equally full. A pool is evened once one of its services is more
than ``tolerance`` above or below its share; then services above their share are *over*,
those below *under*. The decisions:

* placement: under services consume at priority 2, even ones at 1, over ones at 0 (the broker
  gives each start to the highest priority with a free worker, so new creates and every
  observer handed over go to the emptiest first); draining services are cordoned;
* moves: over services hand observers over, down to their share, no more than the under ones
  lack and than the round's budget allows; a service whose last hand-over has not landed yet
  waits (it would be counted twice);
* drains: a draining service hands everything over as fast as the budget and the free
  workers of the others allow, and says so when they are too few to take it all.

Only moves that make the fleet more even are made: a source ends no lower than its share
rounded up, a destination no higher than its share rounded down.
"""

from __future__ import annotations

import math
import sys
import uuid
from dataclasses import dataclass, field

UNDER, EVEN, OVER = 2, 1, 0  # consumer priorities


@dataclass(frozen=True)
class Member:
    """One alive service as the balancer sees it."""

    id: uuid.UUID
    name: str
    capacity: int  # workers
    running: int  # observers the rows say it hosts
    pools: tuple[str, ...]
    draining: bool = False
    busy: bool = False  # its last hand-over has not landed yet
    # What it can run: the kinds it offers (of which those that run in a child process unless
    # a create says otherwise), and how many process slots it has.
    kinds: frozenset[str] = frozenset()
    process_kinds: frozenset[str] = frozenset()
    process_slots: int = 0


@dataclass(frozen=True)
class Move:
    source: uuid.UUID
    pool: str
    count: int
    reason: str  # "even load" or "drain"
    # The services the broker may give what moves to: only what one of them can run moves.
    to: tuple[Member, ...] = ()


@dataclass
class Plan:
    priorities: dict[uuid.UUID, int] = field(default_factory=dict)
    cordoned: set[uuid.UUID] = field(default_factory=set)
    moves: list[Move] = field(default_factory=list)
    drain_notes: dict[uuid.UUID, str] = field(default_factory=dict)
    imbalance: float = 0.0  # the largest deviation from a share, as a fraction of that share
    # Each service's deviation from its share in the pool where it is furthest from it, which
    # decides its priority (one per service, however many pools it serves).
    deviations: dict[uuid.UUID, float] = field(default_factory=dict)


def plan(members: list[Member], tolerance: float, budget: int) -> Plan:
    """One round's decisions; ``budget`` bounds the observers moved in it."""
    out = Plan()
    takers = [m for m in members if not m.draining]
    for m in members:
        if m.draining:
            out.cordoned.add(m.id)
        else:
            out.priorities[m.id] = EVEN
    for pool in sorted({p for m in members for p in m.pools}):
        in_pool = [m for m in takers if pool in m.pools]
        budget -= _drain(out, pool, in_pool, [m for m in members if m.draining and pool in m.pools], budget)
        budget -= _even(out, pool, in_pool, tolerance, budget)
    return out


def drain_note(members: list[Member], service_id: uuid.UUID) -> str:
    """What the drain of ``service_id`` (a draining member) can do now, as the next round
    will say it: the answer to the request that starts it."""
    return plan(members, 0.0, sys.maxsize).drain_notes.get(service_id, "drained")


def imbalance(members: list[Member], tolerance: float = 0.1) -> float:
    """The largest deviation of a service from its fair share of a pool, as a fraction of that
    share (0: even), among the services that take starts."""
    return plan(members, tolerance, 0).imbalance


def shares(members: list[Member]) -> dict[uuid.UUID, float]:
    """Each member's fair share of what they run together, in proportion to capacity."""
    capacity = sum(m.capacity for m in members)
    running = sum(m.running for m in members)
    factor = running / capacity if capacity else 0.0
    return {m.id: m.capacity * factor for m in members}


def _even(out: Plan, pool: str, members: list[Member], tolerance: float, budget: int) -> int:
    if len(members) < 2:
        return 0
    share = shares(members)
    deviation = {m.id: (m.running - share[m.id]) / share[m.id] if share[m.id] > 0 else 0.0 for m in members}
    # Only a service beyond the tolerance, either way, sets the pool moving; then every one
    # above its share gives and every one below takes, down and up to the share: a service
    # 15 % under must get its observers even when nobody is 10 % over.
    active = any(abs(deviation[m.id]) > tolerance and abs(m.running - share[m.id]) >= 1 for m in members)
    excess: dict[uuid.UUID, int] = {}
    lack = 0
    takers: list[Member] = []
    for m in members:
        fair = share[m.id]
        out.imbalance = max(out.imbalance, abs(deviation[m.id]))
        level = EVEN
        if active and m.running - math.ceil(fair) >= 1:
            excess[m.id], level = m.running - math.ceil(fair), OVER
        elif active and math.floor(fair) - m.running >= 1:
            lack, level = lack + math.floor(fair) - m.running, UNDER
            takers.append(m)
        if abs(deviation[m.id]) >= abs(out.deviations.get(m.id, 0.0)):
            out.deviations[m.id], out.priorities[m.id] = deviation[m.id], level
    left = min(lack, max(budget, 0))
    moved = 0
    for m in sorted(members, key=lambda m: -excess.get(m.id, 0)):
        count = min(excess.get(m.id, 0), left - moved)
        if count > 0 and not m.busy:
            out.moves.append(Move(m.id, pool, count, "even load", tuple(takers)))
            moved += count
    return moved


def _drain(out: Plan, pool: str, takers: list[Member], draining: list[Member], budget: int) -> int:
    free = sum(max(m.capacity - m.running, 0) for m in takers)
    moved = 0
    for m in draining:
        if m.running == 0:
            out.drain_notes.setdefault(m.id, "drained")
            continue
        room = free - moved
        count = min(m.running, room, max(budget - moved, 0))
        if room <= 0:
            out.drain_notes[m.id] = (
                f"waiting: the other services of pool {pool} have no free worker ({m.running} observer(s) left)"
            )
        elif room < m.running:
            out.drain_notes[m.id] = (
                f"handing over: {m.running} observer(s) left; the other services of pool {pool} have room "
                f"for {room} only"
            )
        else:
            out.drain_notes[m.id] = f"handing over: {m.running} observer(s) left"
        if count > 0 and not m.busy:
            out.moves.append(Move(m.id, pool, count, "drain", tuple(takers)))
            moved += count
    return moved
