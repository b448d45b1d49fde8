"""``manager.broker_reconnect``: a lost broker connection is retried soon at first and seldom in a long
outage, as a service retries (``shared.backoff``), and replaced if the library stops trying."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import cast

import pytest
from aio_pika.abc import AbstractRobustConnection

from manager import broker_reconnect
from manager.broker_reconnect import Reconnects, reconnect_interval
from shared.broker_nodes import BrokerNodes


def test_a_lost_broker_connection_is_retried_soon_at_first_and_seldom_in_a_long_outage() -> None:
    # A blip is retried within a fraction of a second (the rebuild after a broker lost its
    # data waits for it), an outage of minutes every 2.5 to 5 s, never in lockstep.
    assert 0.1 <= reconnect_interval(1) <= 0.2
    assert reconnect_interval(2, spread=1.0) == 0.4
    assert reconnect_interval(5, spread=1.0) == 3.2
    assert 2.5 <= reconnect_interval(50) <= 5.0
    assert reconnect_interval(50, spread=0.0) == 2.5


async def test_a_reconnect_loop_that_stopped_trying_gets_the_connection_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a lost connection whose library loop makes no attempt (nothing it logs)
    monkeypatch.setattr(broker_reconnect, "STALLED_AFTER_S", 0.3)
    replaced: list[object] = []

    async def replace(connection: object) -> None:
        replaced.append(connection)

    stuck = SimpleNamespace(connected=asyncio.Event(), close_called=False, reconnect_interval=0.2, url=None)
    reconnects = Reconnects(BrokerNodes(["amqp://g:g@127.0.0.1:1/"]), 2, replace)
    reconnects.lost(cast(AbstractRobustConnection, stuck), ConnectionError("gone"))

    # Then after the stall it is handed over to be replaced, once
    for _ in range(50):
        if replaced:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    assert replaced == [stuck]
    reconnects.close()


def test_a_service_name_picks_a_home_node_and_names_spread_over_the_nodes() -> None:
    urls = [f"amqp://g:g@127.0.0.1:{port}/" for port in (5001, 5002, 5003)]
    homes = [BrokerNodes(urls, home_key=f"observer-{i}").home for i in range(300)]
    assert homes == [BrokerNodes(urls, home_key=f"observer-{i}").home for i in range(300)], "not stable"
    assert all(70 <= homes.count(at) <= 130 for at in range(3)), [homes.count(at) for at in range(3)]
    nodes = BrokerNodes(urls, home_key="observer-2")
    assert nodes.current == nodes.home_url and nodes.at_home
    nodes.failed()
    assert not nodes.at_home and nodes.current == urls[(nodes.home + 1) % 3]
    nodes.go_home()
    assert nodes.at_home and nodes.current == nodes.home_url
    assert BrokerNodes(urls).home == 0
