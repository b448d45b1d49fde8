"""``observer_service.service``: a service's reconnect delays are jittered and short."""

from __future__ import annotations

from observer_service.service import reconnect_delay


def test_a_service_retries_its_broker_session_jittered_and_within_two_seconds() -> None:
    """Every second of backoff past the broker's return is a second the service runs nothing,
    and a fleet cut at one instant must not retry in lockstep."""
    first = [reconnect_delay(1) for _ in range(50)]
    later = [reconnect_delay(n) for n in range(2, 200) for _ in range(5)]
    assert all(0.25 <= d <= 0.5 for d in first)
    assert all(d <= 2.0 for d in later) and max(later) > 1.0
    assert len({round(d, 6) for d in first}) > 1
