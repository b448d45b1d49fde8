"""The observers a service runs, keyed by id, and each broker session's digest kept as they
come and go.

Every ``ORCH_INVENTORY_S`` a service sends the count and the XOR of the ids its session runs
(``ServiceDigest``, ``shared.messages.digest_of``). Computed from scratch it walks every
running observer, a cost an otherwise idle fleet should not pay (figures: docs/design.md,
"What grows with the fleet"). XOR is its own inverse, so each session's digest is updated
as an observer is added or removed, and a digest costs nothing.

Invariant: ``digest(session)`` equals ``digest_of`` of the ids held in that session (a
``Running`` keeps the session it was started in for its whole life). Only ``add`` and
``remove`` change what is held; ``tests/unit/test_registry.py`` checks the invariant against
``digest_of`` under random adds and removes.
"""

from __future__ import annotations

import uuid
from collections.abc import ItemsView, ValuesView

from observer_service.observer import Running
from shared.messages import digest_text


class Registry:
    def __init__(self) -> None:
        self._running: dict[uuid.UUID, Running] = {}
        # session -> [count, XOR of the ids' ints]; a session's entry goes with its last observer.
        self._digests: dict[object, list[int]] = {}

    def add(self, running: Running) -> None:
        """Hold ``running`` (replacing an older copy of the same observer, if any)."""
        self.remove(running.observer_id)
        self._running[running.observer_id] = running
        digest = self._digests.setdefault(running.session, [0, 0])
        digest[0] += 1
        digest[1] ^= running.observer_id.int

    def remove(self, observer_id: uuid.UUID) -> Running | None:
        running = self._running.pop(observer_id, None)
        if running is not None:
            digest = self._digests[running.session]
            digest[0] -= 1
            digest[1] ^= observer_id.int
            if digest[0] == 0:
                del self._digests[running.session]
        return running

    def get(self, observer_id: uuid.UUID) -> Running | None:
        return self._running.get(observer_id)

    def values(self) -> ValuesView[Running]:
        return self._running.values()

    def items(self) -> ItemsView[uuid.UUID, Running]:
        return self._running.items()

    def children(self) -> int:
        """How many run in a child process of their own (each takes a process slot)."""
        return sum(1 for r in self._running.values() if r.isolation == "process")

    def __len__(self) -> int:
        return len(self._running)

    def digest(self, session: object) -> tuple[int, str]:
        """(count, digest) of what ``session`` holds, as ``digest_of`` would compute it."""
        count, xor = self._digests.get(session, (0, 0))
        return count, digest_text(xor)
