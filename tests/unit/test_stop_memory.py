"""``observer_service.stop_memory``: a remembered broadcast stop eats the start of the life it
stopped or an older one, once, until it expires; never a newer life."""

from __future__ import annotations

import time
import uuid

from observer_service.stop_memory import StopMemory


def test_a_stop_eats_its_own_life_and_older_ones_once_never_a_newer_one() -> None:
    memory = StopMemory(ttl_s=60)
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    memory.remember(a, 2)
    memory.remember(b, 2)
    memory.remember(c, 2)
    assert memory.eats(a, 2)
    assert not memory.eats(a, 2)  # forgotten once it ate a start
    assert memory.eats(b, 1)  # an older life's start, late
    assert not memory.eats(c, 3)  # restarted since: the new life runs
    assert not memory.eats(uuid.uuid4(), 0)  # never stopped


def test_a_stop_is_forgotten_after_its_ttl() -> None:
    memory = StopMemory(ttl_s=0.05)
    old, new = uuid.uuid4(), uuid.uuid4()
    memory.remember(old, 1)
    time.sleep(0.1)
    memory.remember(new, 1)
    assert not memory.eats(old, 1)
    assert memory.eats(new, 1)
