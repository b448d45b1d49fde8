"""``observer_service.lease``: the fencing lease is valid for half the heartbeat after a
confirmed round trip, lapses, and wakes its waiters across threads."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from observer_service.lease import Lease
from shared.errors import LeaseLost


def test_lease_is_valid_for_half_the_heartbeat_after_a_round_trip_was_sent() -> None:
    lease = Lease(heartbeat_s=2)
    with pytest.raises(LeaseLost, match="not connected"):
        lease.ensure()
    lease.renew(time.monotonic())
    lease.ensure()
    assert 0.9 < lease.remaining_s() <= 1.0
    lease.renew(time.monotonic() - 5)  # an older round trip never shortens the lease
    lease.ensure()
    lease.revoke()
    assert not lease.is_valid()


def test_lease_lapses_when_the_last_round_trip_is_too_old() -> None:
    lease = Lease(heartbeat_s=2)
    lease.renew(time.monotonic() - 1.5)
    with pytest.raises(LeaseLost, match="lapsed"):
        lease.ensure()


def test_a_round_trip_sent_before_a_revocation_does_not_renew_the_lease() -> None:
    # The old session's round trip, answered after the session was given up, proves nothing.
    lease = Lease(heartbeat_s=2)
    sent_at = time.monotonic()
    lease.revoke()
    lease.renew(sent_at)
    assert not lease.is_valid()
    lease.renew(time.monotonic())
    assert lease.is_valid()


async def test_a_renewal_on_another_thread_wakes_the_observers_waiting_on_this_loop() -> None:
    # The holding thread renews; the observers wait on the main loop (hold.py).
    lease = Lease(heartbeat_s=2)
    lease.renew(time.monotonic() - 5)
    waiters = [asyncio.create_task(lease.changed()) for _ in range(3)]
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiters)
    renewer = threading.Thread(target=lambda: lease.renew(time.monotonic()))
    renewer.start()
    renewer.join()
    await asyncio.wait_for(asyncio.gather(*waiters), 5)
    assert lease.is_valid()
