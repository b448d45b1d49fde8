"""Starts that services declined, as the leader last heard (``StartsDeclined``;
``observer_service/declines.py``): a service that cannot run a start (a kind it lacks, no free
process slot) hands it on to another, and holds it a few seconds first when no other one has
a free worker for it. Until one runs it, the start is held by a service or on its way to one.

Two things follow. The lost-start repair must not publish a second copy of such a start
(``recently``): the first copy is in the system, and two would run at once once a service
could take both. And the observer's history says why it waits (a ``declined`` event), once
per service and reason, and again every ``SAY_AGAIN_S`` while it still waits.

Kept in the leader's memory: a new leader hears the next decline within seconds.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

SAY_AGAIN_S = 600.0
_FORGET_AFTER_S = 3600.0


@dataclass
class _Declined:
    at: float  # monotonic: when a service last declined it
    said: tuple[uuid.UUID, str]  # the service and reason its history last got
    said_at: float


class Declines:
    def __init__(self) -> None:
        self._by_observer: dict[uuid.UUID, _Declined] = {}

    def heard(self, observer_id: uuid.UUID, service_id: uuid.UUID, reason: str) -> bool:
        """Note a decline; True if the history should get it (new service or reason, or
        ``SAY_AGAIN_S`` since it was last said)."""
        now = time.monotonic()
        last = self._by_observer.get(observer_id)
        if last is not None and last.said == (service_id, reason) and now - last.said_at < SAY_AGAIN_S:
            last.at = now
            return False
        self._by_observer[observer_id] = _Declined(now, (service_id, reason), now)
        return True

    def recently(self, within_s: float) -> set[uuid.UUID]:
        """The observers whose start a service declined within the last ``within_s``."""
        now = time.monotonic()
        self._by_observer = {oid: d for oid, d in self._by_observer.items() if now - d.at < _FORGET_AFTER_S}
        return {oid for oid, d in self._by_observer.items() if now - d.at < within_s}
