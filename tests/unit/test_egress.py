"""The egress policy of the network kinds (``shared.egress``): which addresses a service
refuses to connect to, and why. Pure logic, plus name resolution of ``localhost``."""

from __future__ import annotations

import ssl

import httpcore
import pytest

from observer_service.settings import ServiceSettings
from shared import egress
from shared.errors import EgressDenied
from shared.kinds.checked_http import CheckedBackend, checked_transport


def policy(allow: str = "", deny: str | None = None) -> egress.EgressPolicy:
    if deny is None:
        return egress.EgressPolicy(allow=egress.parse_networks(allow, egress.ALLOW_ENV))
    return egress.EgressPolicy(
        egress.parse_networks(allow, egress.ALLOW_ENV), egress.parse_networks(deny, egress.DENY_ENV), False
    )


def test_by_default_only_link_local_and_cloud_metadata_are_refused() -> None:
    default = policy()
    for address in ("169.254.169.254", "169.254.170.2", "fe80::1", "fd00:ec2::254"):
        reason = default.refusal(address)
        assert reason is not None and "denied by default (ORCH_EGRESS_DENY unset" in reason, address
    # What deployments watch stays reachable: loopback, private networks, the internet
    for address in ("127.0.0.1", "::1", "10.1.2.3", "192.168.0.10", "8.8.8.8", "2001:db8::1", "fd00:ec2::253"):
        assert default.refusal(address) is None, address


def test_disguised_addresses_are_judged_as_what_they_reach() -> None:
    default = policy()
    assert default.refusal("::ffff:169.254.169.254") == (
        "::ffff:169.254.169.254 (judged as 169.254.169.254) is in 169.254.0.0/16, "
        "denied by default (ORCH_EGRESS_DENY unset: link-local, cloud metadata)"
    )
    assert default.refusal("fe80::1%eth0") is not None  # a zone changes nothing
    no_loopback = policy(deny="127.0.0.0/8, ::1")
    # Linux connects 0.0.0.0 and :: to the local host
    for address in ("127.0.0.1", "127.9.9.9", "0.0.0.0", "::", "::1", "::ffff:127.0.0.1"):
        reason = no_loopback.refusal(address)
        assert reason is not None and "denied by ORCH_EGRESS_DENY" in reason, address


def test_an_operators_deny_list_replaces_the_default_and_empty_denies_nothing() -> None:
    operator = policy(deny="10.0.0.0/8")
    assert operator.refusal("10.0.0.5") == "10.0.0.5 is in 10.0.0.0/8, denied by ORCH_EGRESS_DENY"
    assert operator.refusal("169.254.169.254") is None  # the operator's list is the whole list
    assert policy(deny="").refusal("169.254.169.254") is None


def test_an_allow_list_admits_only_its_networks_and_a_denial_wins() -> None:
    allowing = policy(allow="10.0.0.0/8, 2001:db8::/32", deny="10.0.0.1")
    assert allowing.refusal("10.200.0.1") is None and allowing.refusal("2001:db8::5") is None
    assert allowing.refusal("8.8.8.8") == "8.8.8.8 is outside ORCH_EGRESS_ALLOW (10.0.0.0/8, 2001:db8::/32)"
    assert allowing.refusal("10.0.0.1") == "10.0.0.1 is in 10.0.0.1/32, denied by ORCH_EGRESS_DENY"
    # With the default deny list an allowance cannot open the metadata service either
    assert policy(allow="169.254.0.0/16").refusal("169.254.169.254") is not None


def test_lists_are_parsed_strictly_and_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert egress.parse_networks(" 10.0.0.0/8 ,,::1, 192.168.1.7/24", "X") == (
        egress.parse_networks("10.0.0.0/8", "X")[0],
        egress.parse_networks("::1/128", "X")[0],
        egress.parse_networks("192.168.1.0/24", "X")[0],  # host bits are forgiven
    )
    with pytest.raises(
        ValueError, match=r"ORCH_EGRESS_DENY: not networks or addresses: 'example\.com', '10\.0\.0\.0/33'"
    ):
        egress.parse_networks("10.0.0.0/8, example.com, 10.0.0.0/33", egress.DENY_ENV)

    monkeypatch.delenv(egress.DENY_ENV, raising=False)
    monkeypatch.delenv(egress.ALLOW_ENV, raising=False)
    assert egress.current_policy() == policy()
    monkeypatch.setenv(egress.DENY_ENV, "")
    monkeypatch.setenv(egress.ALLOW_ENV, "127.0.0.0/8")
    assert egress.current_policy() == policy(allow="127.0.0.0/8", deny="")
    # The service refuses to start on a list it cannot read (ServiceSettings parses the same)
    monkeypatch.setenv(egress.ALLOW_ENV, "10.0.0.0/8, intranet")
    with pytest.raises(ValueError, match="ORCH_EGRESS_ALLOW: not networks or addresses: 'intranet'"):
        ServiceSettings()


async def test_a_name_is_refused_when_it_resolves_to_a_refused_address() -> None:
    no_loopback = policy(deny="127.0.0.0/8, ::1")
    with pytest.raises(
        EgressDenied, match=r"connection to localhost:80 refused .*: localhost resolves to (127\.0\.0\.1|::1)"
    ):
        await egress.checked_addresses("localhost", 80, no_loopback)
    with pytest.raises(EgressDenied, match=r"connection to \[::1\]:80 refused .*: ::1 is in ::1/128"):
        await egress.checked_addresses("[::1]", 80, no_loopback)
    assert {info[4][0] for info in await egress.checked_addresses("127.0.0.1", 80, policy())} == {"127.0.0.1"}


def test_the_checked_http_transport_keeps_httpx_connection_limits() -> None:
    """The pool that replaces httpx's keeps its limits: above all, an idle keep-alive
    connection closes after 5 s instead of staying open per poller (httpcore's own default)."""
    pool = checked_transport(policy(), ssl.create_default_context())._pool
    assert isinstance(pool, httpcore.AsyncConnectionPool) and isinstance(pool._network_backend, CheckedBackend)
    assert (pool._keepalive_expiry, pool._max_connections, pool._max_keepalive_connections) == (5.0, 100, 20)
