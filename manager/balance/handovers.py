"""The hand-overs the balancer asked for and whose observer has not started elsewhere yet.

Kept in the leader's memory, shared by the balancer (which records them and waits while a
service has some in flight) and the state rules (which record the start on the new service as
``rebalanced`` and forget it). A leader that changes forgets them: the history then says
``started`` or ``moved`` instead, and the next balancer round starts from the rows.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

LANDS_WITHIN_S = 30.0  # a hand-over not seen landing by then is forgotten


@dataclass(frozen=True)
class Handover:
    source: uuid.UUID
    reason: str
    at: float  # monotonic


class Handovers:
    def __init__(self) -> None:
        self._by_observer: dict[uuid.UUID, Handover] = {}

    def asked(self, source: uuid.UUID, observer_ids: list[uuid.UUID], reason: str) -> None:
        at = time.monotonic()
        for observer_id in observer_ids:
            self._by_observer[observer_id] = Handover(source, reason, at)

    def forget(self, observer_ids: list[uuid.UUID]) -> None:
        """Hand-overs that were never sent."""
        for observer_id in observer_ids:
            self._by_observer.pop(observer_id, None)

    def landed(self, observer_id: uuid.UUID) -> Handover | None:
        """The hand-over of an observer that just started somewhere, if one was asked for."""
        return self._by_observer.pop(observer_id, None)

    def of(self, observer_id: uuid.UUID) -> Handover | None:
        return self._by_observer.get(observer_id)

    def busy(self) -> set[uuid.UUID]:
        """The services with hand-overs still in flight (forgetting those that never landed)."""
        too_old = time.monotonic() - LANDS_WITHIN_S
        self._by_observer = {oid: h for oid, h in self._by_observer.items() if h.at >= too_old}
        return {h.source for h in self._by_observer.values()}
