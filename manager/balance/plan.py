"""What the balancer decides in one round, from the fleet as the rows say it (pure logic).

Each pool is evened on its own, from what each service runs *in that pool*: a service serving
two pools holds ``workers_count`` starts of each (each pool's queue has its own prefetch), so
its load in one says nothing of its room in the other. A service's fair share of a pool is
its capacity times the pool's load factor (observers over workers of the services that take
its starts); shares are relative to capacity, so services of different sizes are even when
equally full. A pool is evened once one of its services is more than ``tolerance`` above or
below its share; then services above their share are *over*, those below *under*. The
decisions:

* placement, per pool: under services consume that pool's queue at priority 2, even ones at
  1, over ones at 0 (the broker gives each start to the highest priority with a free worker,
  so new creates and every observer handed over go to the emptiest first); draining services
  are cordoned;
* moves: over services hand observers over, down to their share, no more than the under ones
  lack beyond the starts in flight; a service whose last hand-over has not landed yet waits
  (it would be counted twice);
* drains: a draining service hands everything over as fast as the free workers of the others
  allow, and says so when they are too few to take it all.

Starts in flight (``in_flight``: a pool's observers published and not yet reported running)
are in no service's count yet, and a burst of creates reaches each service's count at its own
pace, though the broker dealt it evenly. A difference the starts in flight could explain sets
nothing moving: evened on it, the placement sent the whole burst to the services that merely
looked under, the next round to the others, and hand-overs restarted observers that ran fine
(docs/design.md, "Even load"). Beyond them the pool is evened as before, so a burst still
fills an empty service first, until it is within the starts in flight of its share.

Only moves that make the fleet more even are made: a source ends no lower than its share
rounded up, a destination no higher than its share rounded down. How many observers a round
moves at most is the caller's (``rounds.py``): a move whose observers cannot
all go (pinned, or of a kind no taker runs) spends only what it moves.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.messages import EVEN, OVER, UNDER

# A placement as ``SetPlacement`` carries it and heartbeats report it: the priority, whether
# cordoned, and the (pool, priority) pairs of pools that have one of their own.
Placed = tuple[int, bool, tuple[tuple[str, int], ...]]


@dataclass(frozen=True)
class Member:
    """One alive service as the balancer sees it."""

    id: uuid.UUID
    name: str
    capacity: int  # workers, in each of its pools
    running: int  # observers the rows say it runs, in all its pools
    pools: tuple[str, ...]
    draining: bool = False
    busy: bool = False  # its last hand-over has not landed yet
    # What it can run: the kinds it offers (of which those that run in a child process unless
    # a create says otherwise), and how many process slots it has.
    kinds: frozenset[str] = frozenset()
    process_kinds: frozenset[str] = frozenset()
    process_slots: int = 0
    # Of ``running``, how many in each pool; empty: all of it in its one pool.
    by_pool: Mapping[str, int] = field(default_factory=dict)

    def running_in(self, pool: str) -> int:
        if self.by_pool:
            return self.by_pool.get(pool, 0)
        return self.running if pool in self.pools else 0


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
    # Each taking service's priority in each of its pools.
    priorities: dict[uuid.UUID, dict[str, int]] = field(default_factory=dict)
    cordoned: set[uuid.UUID] = field(default_factory=set)
    moves: list[Move] = field(default_factory=list)  # drains first
    drain_notes: dict[uuid.UUID, str] = field(default_factory=dict)
    imbalance: float = 0.0  # the largest deviation from a share, as a fraction of that share


def plan(members: list[Member], tolerance: float, in_flight: Mapping[str, int] | None = None) -> Plan:
    """One round's decisions; ``in_flight``: each pool's starts no service's count holds yet."""
    out = Plan()
    takers = [m for m in members if not m.draining]
    for m in members:
        if m.draining:
            out.cordoned.add(m.id)
        else:
            out.priorities[m.id] = dict.fromkeys(m.pools, EVEN)
    evens: list[Move] = []
    for pool in sorted({p for m in members for p in m.pools}):
        in_pool = [m for m in takers if pool in m.pools]
        _drain(out, pool, in_pool, [m for m in members if m.draining and pool in m.pools])
        evens += _even(out, pool, in_pool, tolerance, (in_flight or {}).get(pool, 0))
    out.moves += evens
    return out


def placement(decided: Plan, service_id: uuid.UUID) -> Placed:
    """The placement ``decided`` gives a service: one priority when its pools agree (what a
    service older than per-pool priorities understands), else one per pool."""
    if service_id in decided.cordoned:
        return (EVEN, True, ())
    levels = decided.priorities.get(service_id, {})
    if len(set(levels.values())) <= 1:
        return (next(iter(levels.values()), EVEN), False, ())
    return (EVEN, False, tuple(sorted(levels.items())))


def drain_note(members: list[Member], service_id: uuid.UUID) -> str:
    """What the drain of ``service_id`` (a draining member) can do now, as the next round
    will say it: the answer to the request that starts it."""
    return plan(members, 0.0).drain_notes.get(service_id, "drained")


def imbalance(members: list[Member], tolerance: float = 0.1) -> float:
    """The largest deviation of a service from its fair share of a pool, as a fraction of that
    share (0: even), among the services that take starts."""
    return plan(members, tolerance).imbalance


def shares(members: list[Member], pool: str) -> dict[uuid.UUID, float]:
    """Each member's fair share of what they run together in ``pool``, in proportion to capacity."""
    capacity = sum(m.capacity for m in members)
    running = sum(m.running_in(pool) for m in members)
    factor = running / capacity if capacity else 0.0
    return {m.id: m.capacity * factor for m in members}


def _even(out: Plan, pool: str, members: list[Member], tolerance: float, in_flight: int) -> list[Move]:
    if len(members) < 2:
        return []
    share = shares(members, pool)
    running = {m.id: m.running_in(pool) for m in members}
    deviation = {m.id: (running[m.id] - share[m.id]) / share[m.id] if share[m.id] > 0 else 0.0 for m in members}
    # Only a service beyond the tolerance, either way, sets the pool moving; then every one
    # above its share gives and every one below takes, down and up to the share: a service
    # 15 % under must get its observers even when nobody is 10 % over. A difference no larger
    # than the starts in flight sets nothing moving (module docstring).
    active = any(
        abs(deviation[m.id]) > tolerance and abs(running[m.id] - share[m.id]) >= in_flight + 1 for m in members
    )
    excess: dict[uuid.UUID, int] = {}
    lack = 0
    takers: list[Member] = []
    for m in members:
        fair = share[m.id]
        out.imbalance = max(out.imbalance, abs(deviation[m.id]))
        level = EVEN
        if active and running[m.id] - math.ceil(fair) >= 1:
            excess[m.id], level = running[m.id] - math.ceil(fair), OVER
        elif active and math.floor(fair) - running[m.id] >= 1:
            lack, level = lack + math.floor(fair) - running[m.id], UNDER
            takers.append(m)
        out.priorities[m.id][pool] = level
    moves = []
    # The starts in flight go to the under ones first (their priority): moved on top of them,
    # as many observers would have to move back.
    moved = in_flight
    for m in sorted(members, key=lambda m: -excess.get(m.id, 0)):
        count = min(excess.get(m.id, 0), lack - moved)
        if count > 0 and not m.busy:
            moves.append(Move(m.id, pool, count, "even load", tuple(takers)))
            moved += count
    return moves


def _drain(out: Plan, pool: str, takers: list[Member], draining: list[Member]) -> None:
    free = sum(max(m.capacity - m.running_in(pool), 0) for m in takers)
    moved = 0
    for m in draining:
        left = m.running_in(pool)
        if left == 0:
            out.drain_notes.setdefault(m.id, "drained")
            continue
        room = free - moved
        count = min(left, room)
        if room <= 0:
            note = f"waiting: the other services of pool {pool} have no free worker ({left} observer(s) left)"
        elif room < left:
            note = f"handing over: {left} observer(s) left; the other services of pool {pool} have room for {room} only"
        else:
            note = f"handing over: {left} observer(s) left"
        # One note per service: the pools it still has observers in, in order.
        out.drain_notes[m.id] = (
            note if out.drain_notes.get(m.id, "drained") == "drained" else f"{out.drain_notes[m.id]}; {note}"
        )
        if count > 0 and not m.busy:
            out.moves.append(Move(m.id, pool, count, "drain", tuple(takers)))
            moved += count
