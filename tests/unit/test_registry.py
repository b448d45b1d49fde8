"""``observer_service.registry``: each session's digest kept as observers come and go."""

from __future__ import annotations

import random
import uuid

from observer_service.observer import Running
from observer_service.registry import Registry
from shared.messages import (
    digest_of,
)


def test_held_keeps_each_sessions_digest_as_observers_come_and_go() -> None:
    # The digest a service sends is kept up to date as observers are added and removed
    # instead of walking all of them every period: it must always equal digest_of over what
    # each session really holds, whatever the order of adds, replacements and removes.
    rng = random.Random(17)
    held = Registry()
    sessions = [object(), object(), object()]
    ids = [uuid.uuid4() for _ in range(300)]
    for _ in range(5_000):
        oid = rng.choice(ids)
        if rng.random() < 0.6:
            session = rng.choice(sessions)
            held.add(Running(oid, b"{}", None, 1, session, None))  # type: ignore[arg-type]
        else:
            held.remove(oid)
        if rng.random() < 0.05:
            for session in sessions:
                mine = [r.observer_id for r in held.values() if r.session is session]
                assert held.digest(session) == (len(mine), digest_of(mine))
    assert len(held) == len({r.observer_id for r in held.values()})
    for session in sessions:
        mine = [r.observer_id for r in held.values() if r.session is session]
        assert held.digest(session) == (len(mine), digest_of(mine))
    assert held.digest(object()) == (0, digest_of([]))
