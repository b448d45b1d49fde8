"""The give-up bound against the broker's net_ticktime (``observer_service/net_ticktime.py``):
where it is read, how the page is parsed, and what each answer makes of the bound. The
endpoint here is a loopback HTTP server serving a page shaped as RabbitMQ 4.3.6 serves it;
tests/system/test_net_ticktime.py reads a real node's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from observer_service import metrics
from observer_service.net_ticktime import NetTicktime, endpoint_urls, parse, safe_give_up

PAGE = """\
# TYPE rabbitmq_erlang_processes_used gauge
rabbitmq_erlang_processes_used 613
# TYPE rabbitmq_erlang_net_ticktime_seconds gauge
# HELP rabbitmq_erlang_net_ticktime_seconds Inter-node heartbeat interval
rabbitmq_erlang_net_ticktime_seconds {ticktime}
# TYPE rabbitmq_identity_info untyped
rabbitmq_identity_info{{rabbitmq_node="rabbit@a",rabbitmq_endpoint="aggregated"}} 1
"""
RENEWAL_S = 0.25  # a cluster's lease: valid 1 s, renewed every quarter of it


def test_the_endpoints_are_the_broker_hosts_unless_given() -> None:
    urls = ["amqp://u:p@rabbit-0:5672/", "amqps://u:p@rabbit-1:5671/v", "amqp://u:p@rabbit-0:5673/", "amqp://[::1]/"]
    assert endpoint_urls(urls, []) == [
        "http://rabbit-0:15692/metrics",
        "https://rabbit-1:15691/metrics",  # TLS to the broker: its Prometheus endpoint's TLS port
        "http://[::1]:15692/metrics",
    ]
    assert endpoint_urls(urls, ["http://m:9419/metrics"]) == ["http://m:9419/metrics"]
    assert endpoint_urls(urls, ["None"]) == []


def test_the_page_is_parsed_for_the_one_metric() -> None:
    assert parse(PAGE.format(ticktime=20)) == 20.0
    assert parse('rabbitmq_erlang_net_ticktime_seconds{node="x"} 7.5\n') == 7.5
    with pytest.raises(ValueError, match="no rabbitmq_erlang_net_ticktime_seconds"):
        parse("rabbitmq_erlang_net_ticktime_seconds_total 3\nrabbitmq_identity_info 1\n")


def test_the_give_up_is_lowered_only_when_the_ticktime_is_too_short_for_it() -> None:
    # G + P + 1 s must stay under 0.75 N + T (T = 2 s): 10 + 0.25 + 1 < 15 + 2 with N = 20.
    assert safe_give_up(10, 20, RENEWAL_S) == 10
    assert safe_give_up(10, 60, RENEWAL_S) == 10
    assert safe_give_up(10, 10, RENEWAL_S) == pytest.approx(8.25)
    assert safe_give_up(10, 1, RENEWAL_S) == pytest.approx(1.5)


Serve = Callable[[bytes], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[asyncio.Server] = []

    async def start(response: bytes) -> str:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(response)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"

    yield start
    for server in servers:
        server.close()


def page(ticktime: float, metric: str = "rabbitmq_erlang_net_ticktime_seconds") -> bytes:
    body = PAGE.format(ticktime=ticktime).replace("rabbitmq_erlang_net_ticktime_seconds", metric).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)


async def test_the_shortest_ticktime_read_bounds_the_give_up(serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    long, short = await serve(page(60)), await serve(page(10))
    ticktime = NetTicktime([long, short], 10.0, RENEWAL_S)
    assert await ticktime.check()
    assert ticktime.give_up_s == pytest.approx(8.25)
    assert metrics.REGISTRY.get_sample_value("orch_service_lease_give_up_seconds") == pytest.approx(8.25)
    said = caplog.text
    assert "lease give-up lowered from ORCH_LEASE_GIVE_UP_S=10 to 8.25 s" in said
    assert f"net_ticktime is 60 s at {long}" in said and "up to 77 s" in said and "set net_ticktime = 20" in said
    caplog.clear()
    assert await ticktime.check()
    assert caplog.text == ""  # said once, not at every check


async def test_an_endpoint_that_does_not_answer_leaves_the_give_up_as_set(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    missing = await serve(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    old = await serve(page(20, metric="rabbitmq_erlang_uptime_seconds"))
    ticktime = NetTicktime([missing, old], 10.0, RENEWAL_S)
    assert not await ticktime.check()
    assert ticktime.give_up_s == 10.0
    assert f"cannot read the broker's net_ticktime from {missing} (HTTP 404)" in caplog.text
    assert "no rabbitmq_erlang_net_ticktime_seconds in it" in caplog.text
    assert "safe only if every node's net_ticktime is at least 12 s" in caplog.text
