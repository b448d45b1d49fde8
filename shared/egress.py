"""Where the network kinds (``http_poll``, ``websocket``) may connect.

Whoever may create observers chooses their URLs, so without a limit a service fetches
whatever it can reach on behalf of an API caller: the cloud metadata service at
169.254.169.254 (instance credentials), its own loopback, the broker, internal networks. The
operator of a service sets two lists of networks (CIDRs or single addresses,
comma-separated); both kinds check every address a host name resolves to *when they
connect*, and connect only to the addresses they checked, so a DNS answer cannot change
between the check and the connection (DNS rebinding).

* ``ORCH_EGRESS_DENY``: never these. Unset, it denies the link-local networks
  (169.254.0.0/16, fe80::/10: the metadata services of AWS, GCP, Azure, OpenStack,
  DigitalOcean..., and no ordinary service) and AWS's IPv6 metadata address
  (fd00:ec2::254). Set, it replaces that default; set and empty, nothing is denied.
* ``ORCH_EGRESS_ALLOW``: when set, only these. Unset or empty: anywhere not denied.
* A denial wins over an allowance (allow 10.0.0.0/8, deny 10.0.0.1).
* A host name is refused when *any* of its addresses is refused.
* ``::ffff:a.b.c.d`` is judged as ``a.b.c.d``, and an unspecified address (0.0.0.0, ::),
  which Linux connects to the local host, as loopback.

Loopback and private networks are not denied by default: watching internal services is what
many deployments run observers for. ``docs/threat-model.md`` recommends a deny list for the others.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.errors import EgressDenied

ALLOW_ENV = "ORCH_EGRESS_ALLOW"
DENY_ENV = "ORCH_EGRESS_DENY"
DEFAULT_DENY = "169.254.0.0/16,fe80::/10,fd00:ec2::254/128"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, Any]

_LOOPBACK: dict[int, Address] = {4: ipaddress.IPv4Address("127.0.0.1"), 6: ipaddress.IPv6Address("::1")}


def parse_networks(raw: str, variable: str) -> tuple[Network, ...]:
    """Comma-separated networks (``10.0.0.0/8``) or addresses (``10.0.0.1``); ``ValueError``
    naming ``variable`` for anything else, so a typo stops the service at start."""
    networks, bad = [], []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            bad.append(item)
    if bad:
        raise ValueError(f"{variable}: not networks or addresses: {', '.join(map(repr, bad))}")
    return tuple(networks)


def judged(address: str) -> Address:
    """The address a connection to ``address`` really reaches, as the lists see it."""
    ip = ipaddress.ip_address(address.partition("%")[0])  # an IPv6 zone does not matter here
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return _LOOPBACK[ip.version] if ip.is_unspecified else ip


@dataclass(frozen=True)
class EgressPolicy:
    allow: tuple[Network, ...] = ()  # empty: anywhere not denied
    deny: tuple[Network, ...] = parse_networks(DEFAULT_DENY, DENY_ENV)
    default_deny: bool = True  # ``deny`` is the default, not the operator's list (for messages)

    def refusal(self, address: str) -> str | None:
        """Why a connection to ``address`` (an IP) is refused, or None when it is not."""
        ip = judged(address)
        shown = address if str(ip) == address else f"{address} (judged as {ip})"
        for network in self.deny:
            if ip in network:
                if self.default_deny:
                    return f"{shown} is in {network}, denied by default ({DENY_ENV} unset: link-local, cloud metadata)"
                return f"{shown} is in {network}, denied by {DENY_ENV}"
        if self.allow and not any(ip in network for network in self.allow):
            return f"{shown} is outside {ALLOW_ENV} ({', '.join(map(str, self.allow))})"
        return None


@functools.lru_cache(maxsize=8)
def _policy(allow: str, deny: str | None) -> EgressPolicy:
    if deny is None:
        return EgressPolicy(allow=parse_networks(allow, ALLOW_ENV))
    return EgressPolicy(parse_networks(allow, ALLOW_ENV), parse_networks(deny, DENY_ENV), default_deny=False)


def current_policy() -> EgressPolicy:
    """This process's policy, from its environment (a kind asks once per run; child
    processes inherit the service's environment)."""
    return _policy(os.environ.get(ALLOW_ENV, ""), os.environ.get(DENY_ENV))


async def checked_addresses(host: str, port: int, policy: EgressPolicy) -> Sequence[AddrInfo]:
    """Resolve ``host`` (a name or an IP) for a TCP connection and check every address;
    ``EgressDenied`` if any is refused. Resolution errors (``socket.gaierror``) pass."""
    bare = host.strip("[]")  # an IPv6 literal as URLs write it
    infos: Sequence[AddrInfo] = await asyncio.get_running_loop().getaddrinfo(bare, port, type=socket.SOCK_STREAM)
    for info in infos:
        reason = policy.refusal(str(info[4][0]))
        if reason is not None:
            named = "" if info[4][0] == bare else f"{host} resolves to "
            raise EgressDenied(f"connection to {host}:{port} refused by the service's egress policy: {named}{reason}")
    return infos


async def connect_socket(host: str, port: int, policy: EgressPolicy) -> socket.socket:
    """A connected, non-blocking TCP socket to ``host``, tried address by address (only the
    checked ones). Raises ``EgressDenied``, or the ``OSError`` of the last address tried."""
    loop = asyncio.get_running_loop()
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in await checked_addresses(host, port, policy):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, sockaddr)
        except OSError as e:
            sock.close()
            last = e
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise last if last is not None else OSError(f"{host}:{port} resolves to no address")
