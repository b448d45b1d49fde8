"""Counting failovers (``moved`` events of the history) without reading the history twice.

Event ids follow insertion, not commit: a transaction that took ids 100-110 may commit after
one that took 111, so "every event above the last id seen" would miss 100-110 for good. The
counter therefore counts every event above a floor ``lo`` each time, and the increase of that
count is what is new; ``lo`` moves up to the highest id seen ``settle_s`` ago, so only a
transaction open longer than that (none writes moves for so long) is missed. Each read scans
the events of the last ``settle_s`` to two of them, through the primary key. Pure: the
caller runs the query (``manager.db.history.moves_above``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class MoveCounter:
    settle_s: float = 60.0
    lo: int | None = None  # None: not started (the first read only places the floor)
    next_lo: int | None = None
    seen: int = 0  # moves above lo counted so far
    total: int = 0  # moves counted since the start
    _marks: deque[tuple[float, int]] = field(default_factory=deque)  # (when, highest id seen)

    def floors(self) -> tuple[int, int]:
        """The two floors of the next read: ``lo`` and the one it will move to."""
        lo = self.lo if self.lo is not None else 0
        return lo, self.next_lo if self.next_lo is not None else lo

    def update(self, now: float, above_lo: int, above_next: int, max_id: int | None) -> int:
        """Take a read's counts (moves above each floor, the highest id); return the total."""
        if self.lo is None:
            # The history before the sampler began is not counted: start at its end.
            self.lo = self.next_lo = max_id or 0
            self._marks.append((now, self.lo))
            return self.total
        self.total += max(0, above_lo - self.seen)
        self.seen = above_lo
        if self.next_lo is not None and self.next_lo != self.lo:
            self.lo, self.seen = self.next_lo, above_next
        self._marks.append((now, max(max_id or 0, self._marks[-1][1] if self._marks else 0)))
        # The next floor: the highest id seen at least settle_s ago.
        while len(self._marks) > 1 and self._marks[1][0] <= now - self.settle_s:
            self._marks.popleft()
        if self._marks[0][0] <= now - self.settle_s:
            self.next_lo = max(self.lo, self._marks[0][1])
        return self.total
