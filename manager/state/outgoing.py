"""Control messages the state side decides while applying reports, published only after the
transaction that decided them committed (merged per target: one broadcast per host, not
one per observer)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from shared.messages import (
    IntroduceRequest,
    InventoryRequest,
    IsolateObservers,
    Message,
    StopObserver,
    stop_messages,
)


@dataclass
class Outgoing:
    """Control messages to publish once the transaction committed."""

    messages: list[Message] = field(default_factory=list)

    def stop(
        self, observer_id: uuid.UUID, service_id: uuid.UUID | None, reason: str, session_id: uuid.UUID | None = None
    ) -> None:
        """A stop; with ``service_id`` only that host acts, with ``session_id`` too only on
        the copy it holds in that session."""
        self.messages.append(
            StopObserver(observer_id=observer_id, service_id=service_id, session_id=session_id, reason=reason)
        )

    def isolate(self, observer_id: uuid.UUID, service_id: uuid.UUID) -> None:
        self.messages.append(IsolateObservers(observer_ids=[observer_id], service_id=service_id))

    def introduce(self, service_id: uuid.UUID, *, name_taken: bool = False) -> None:
        self.messages.append(IntroduceRequest(service_id=service_id, name_taken=name_taken))

    def batched(self) -> list[Message]:
        """Stops with the same target and reason merged into ``StopObservers``, isolations
        per host merged, requests deduplicated; the order between targets does not matter."""
        stops: dict[tuple[uuid.UUID | None, uuid.UUID | None, str], list[uuid.UUID]] = {}
        isolations: dict[uuid.UUID, list[uuid.UUID]] = {}
        others: list[Message] = []
        asked: set[tuple[str, uuid.UUID | None]] = set()
        for message in self.messages:
            if isinstance(message, StopObserver):
                key = (message.service_id, message.session_id, message.reason)
                stops.setdefault(key, []).append(message.observer_id)
            elif isinstance(message, IsolateObservers):
                isolations.setdefault(message.service_id, []).extend(message.observer_ids)
            elif isinstance(message, InventoryRequest | IntroduceRequest):
                if (message.type, message.service_id) not in asked:
                    asked.add((message.type, message.service_id))
                    others.append(message)
            else:
                others.append(message)
        merged: list[Message] = []
        for (service_id, session_id, reason), ids in stops.items():
            if len(ids) == 1:
                merged.append(
                    StopObserver(observer_id=ids[0], service_id=service_id, session_id=session_id, reason=reason)
                )
                continue
            merged += stop_messages(ids, reason, service_id, session_id)
        merged += [IsolateObservers(observer_ids=ids, service_id=sid) for sid, ids in isolations.items()]
        return merged + others
