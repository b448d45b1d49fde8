"""The follow-ups of a batch of reports: control messages the state side decides while applying
them, published only after the transaction that decided them committed (merged per target:
one broadcast per service, not one per observer), and the starts gone with a deleted start
queue, handed to the gone-start repair only then: it reads their rows in a transaction of its
own, and one that ran before the commit found none of them pending and forgot them.

Stops and isolations are kept as ids per target and turned into messages once, in
``batched``: a failover decides a stop of the old service's copy for each observer it moves
(``observer_reports.started``), and building a pydantic stop (with its uuid4 and clock
read) for each only to merge them again was a large share of the state process (figures:
docs/cost-curve.md).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from shared.messages import (
    IntroduceRequest,
    InventoryRequest,
    IsolateObservers,
    Message,
    stop_messages,
)

# (service or None for any, its broker session or None for any copy, reason)
StopTarget = tuple[uuid.UUID | None, uuid.UUID | None, str]


@dataclass
class FollowUps:
    """Control messages to publish once the transaction committed."""

    messages: list[Message] = field(default_factory=list)  # any but stops and isolations
    # Ids per target in the order decided, each once (a dict as an ordered set): one batch
    # may decide the same stop twice (a start report and an inventory naming one observer).
    stops: dict[StopTarget, dict[uuid.UUID, None]] = field(default_factory=dict)
    isolations: dict[uuid.UUID, list[uuid.UUID]] = field(default_factory=dict)
    gone_starts: list[uuid.UUID] = field(default_factory=list)

    def stop(
        self, observer_id: uuid.UUID, service_id: uuid.UUID | None, reason: str, session_id: uuid.UUID | None = None
    ) -> None:
        """A stop; with ``service_id`` only that service acts, with ``session_id`` too only on
        the copy it holds in that session."""
        self.stops.setdefault((service_id, session_id, reason), {})[observer_id] = None

    def isolate(self, observer_id: uuid.UUID, service_id: uuid.UUID) -> None:
        self.isolations.setdefault(service_id, []).append(observer_id)

    def introduce(self, service_id: uuid.UUID, *, name_taken: bool = False) -> None:
        self.messages.append(IntroduceRequest(service_id=service_id, name_taken=name_taken))

    def add(self, other: FollowUps) -> None:
        """Take ``other``'s messages too (in order, after this one's)."""
        self.messages += other.messages
        for target, stopped in other.stops.items():
            self.stops.setdefault(target, {}).update(stopped)
        for service_id, isolated in other.isolations.items():
            self.isolations.setdefault(service_id, []).extend(isolated)
        self.gone_starts += other.gone_starts

    def batched(self) -> list[Message]:
        """Stops with the same target and reason merged into ``StopObservers``, isolations
        per service merged, requests deduplicated; the order between targets does not matter."""
        merged: list[Message] = []
        for (service_id, session_id, reason), unique_ids in self.stops.items():
            merged += stop_messages(list(unique_ids), reason, service_id, session_id)
        merged += [IsolateObservers(observer_ids=ids, service_id=sid) for sid, ids in self.isolations.items()]
        asked: set[tuple[str, uuid.UUID | None]] = set()
        for message in self.messages:
            if isinstance(message, InventoryRequest | IntroduceRequest):
                if (message.type, message.service_id) in asked:
                    continue
                asked.add((message.type, message.service_id))
            merged.append(message)
        return merged
