"""``manager.broker``: a lost broker connection is retried soon at first and seldom in a long
outage."""

from __future__ import annotations

from manager.broker import reconnect_interval


def test_a_lost_broker_connection_is_retried_soon_at_first_and_seldom_in_a_long_outage() -> None:
    # A quarter of the time down: a blip is retried within a fraction of a second (the
    # rebuild after a broker lost its data waits for it), an outage of minutes every 5 s.
    assert reconnect_interval(0.0) == 0.2
    assert reconnect_interval(2.0) == 0.5
    assert reconnect_interval(12.0) == 3.0
    assert reconnect_interval(600.0) == 5.0
