"""``manager.broker_reconnect``: a lost broker connection is retried soon at first and seldom in a long
outage, as a service retries (``shared.backoff``)."""

from __future__ import annotations

from manager.broker_reconnect import reconnect_interval


def test_a_lost_broker_connection_is_retried_soon_at_first_and_seldom_in_a_long_outage() -> None:
    # A blip is retried within a fraction of a second (the rebuild after a broker lost its
    # data waits for it), an outage of minutes every 2.5 to 5 s, never in lockstep.
    assert 0.1 <= reconnect_interval(1) <= 0.2
    assert reconnect_interval(2, spread=1.0) == 0.4
    assert reconnect_interval(5, spread=1.0) == 3.2
    assert 2.5 <= reconnect_interval(50) <= 5.0
    assert reconnect_interval(50, spread=0.0) == 2.5
