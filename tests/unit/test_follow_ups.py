"""``manager.state.follow_ups``: stops merged per target and isolations per old, asked once."""

from __future__ import annotations

import uuid

from manager.state.follow_ups import FollowUps
from shared.messages import (
    STOPS_PER_MESSAGE,
    IntroduceRequest,
    InventoryRequest,
    IsolateObservers,
    StopObservers,
)


def test_follow_ups_merge_stops_per_target_and_isolations_per_service_and_asks_once() -> None:
    old, other, session_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    moved = [uuid.uuid4() for _ in range(STOPS_PER_MESSAGE + 5)]
    lone, isolated = uuid.uuid4(), [uuid.uuid4(), uuid.uuid4()]
    first, second = FollowUps(), FollowUps()
    for observer_id in moved[:10]:
        first.stop(observer_id, old, "moved to another service", session_id)
    first.isolate(isolated[0], other)
    first.messages.append(InventoryRequest(service_id=old))
    for observer_id in moved[10:]:
        second.stop(observer_id, old, "moved to another service", session_id)
    second.stop(lone, other, "duplicate start message")
    second.stop(lone, other, "duplicate start message")  # decided twice in one batch: sent once
    second.stop(moved[3], old, "moved to another service", session_id)  # and across merged batches
    second.isolate(isolated[1], other)
    second.messages.append(InventoryRequest(service_id=old))
    second.introduce(other)
    first.add(second)

    messages = first.batched()
    stops = [m for m in messages if isinstance(m, StopObservers)]
    batches = [m for m in stops if m.service_id == old]
    assert [len(b.observer_ids) for b in batches] == [STOPS_PER_MESSAGE, 5]
    assert [oid for b in batches for oid in b.observer_ids] == moved  # in the order decided
    assert all((b.service_id, b.session_id, b.reason) == (old, session_id, "moved to another service") for b in batches)
    singles = [m for m in stops if m.service_id != old]
    assert [(m.observer_ids, m.service_id, m.session_id) for m in singles] == [([lone], other, None)]
    isolations = [m for m in messages if isinstance(m, IsolateObservers)]
    assert [(m.service_id, m.observer_ids) for m in isolations] == [(other, isolated)]
    assert [type(m) for m in messages if isinstance(m, InventoryRequest | IntroduceRequest)] == [
        InventoryRequest,
        IntroduceRequest,
    ]
