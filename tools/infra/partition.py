"""Cut one member of a local cluster (``cluster``) off from the others: a network partition of
its Erlang distribution traffic only, while AMQP and rabbitmqctl reach every node as before.

Each member opens its distribution connections from a loopback address of its own
(``cluster.dist_source``) and listens on its own port, so nftables rules on loopback can drop
exactly the packets between the cut member and the others: from its address to their
distribution ports, from their addresses to its port, and the replies of both. Packets are
dropped, not refused, as on a real network: each side notices only through ``net_ticktime``.

The rules live in a table of their own per cluster (``table_name``), deleted by ``heal``; the
infrastructure's ``down`` and ``destroy`` heal too, so no run leaves a cluster cut. ``nft``
comes from Debian's ``nftables`` package, installed when missing (as root, like the rest).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence

from tools.infra.packages import apt_install
from tools.infra.rabbitmq import RabbitNode
from tools.infra.system import InfraError, log, run

_FAMILY = "inet"


def table_name(nodes: Sequence[RabbitNode]) -> str:
    """The project's nftables table for this cluster: one per cluster, so that two checkouts'
    clusters on one machine never heal or cut each other."""
    digest = hashlib.sha256(",".join(sorted(n.node for n in nodes)).encode()).hexdigest()[:8]
    return f"orch_partition_{digest}"


def _nft(ensure: bool) -> str | None:
    if os.geteuid() != 0:
        if ensure:
            raise InfraError("cutting a node off (nftables) needs root")
        return None  # not root: no cut was made here, none to see or heal
    found = shutil.which("nft") or shutil.which("nft", path="/usr/sbin:/sbin")
    if found is None and ensure:
        apt_install(["nftables"])
        found = shutil.which("nft", path="/usr/sbin:/sbin:/usr/bin")
        if found is None:
            raise InfraError("nftables installed but no nft binary found")
    return found


def rules(nodes: Sequence[RabbitNode], cut: RabbitNode) -> str:
    """The nft script that cuts ``cut`` off from the other ``nodes`` (nothing else)."""
    others = [n for n in nodes if n is not cut]
    if not others or len(others) == len(nodes):
        raise InfraError(f"{cut.node} is not one of several nodes of this cluster")
    for node in nodes:
        if not node.dist_source:
            raise InfraError(f"{node.node} has no distribution address of its own (tools/infra/cluster.py)")
    ports = ", ".join(str(n.dist_port) for n in others)
    sources = ", ".join(n.dist_source for n in others)
    return f"""table {_FAMILY} {table_name(nodes)} {{
  chain output {{
    type filter hook output priority 0; policy accept;
    ip saddr {cut.dist_source} tcp dport {{ {ports} }} drop
    ip daddr {cut.dist_source} tcp sport {{ {ports} }} drop
    ip saddr {{ {sources} }} tcp dport {cut.dist_port} drop
    ip daddr {{ {sources} }} tcp sport {cut.dist_port} drop
  }}
}}
"""


def cut(nodes: Sequence[RabbitNode], node: RabbitNode) -> None:
    """Drop every distribution packet between ``node`` and the other ``nodes`` (one cut at a
    time: a cut replaces any earlier one)."""
    for member in nodes:
        if member.live_pid() is not None and not member.started_with_dist_source():
            raise InfraError(
                f"{member.node} runs without its own distribution address (started by an older checkout): "
                "`python -m tools.infra down`, then start the cluster again"
            )
    script = rules(nodes, node)
    nft = _nft(ensure=True)
    assert nft is not None
    heal(nodes)
    run([nft, "-f", "-"], input_text=script)
    log(f"partition: {node.node} cut off from {', '.join(n.node for n in nodes if n is not node)}")


def is_cut(nodes: Sequence[RabbitNode]) -> bool:
    nft = _nft(ensure=False)
    return nft is not None and table_name(nodes) in run([nft, "list", "tables", _FAMILY])


def heal(nodes: Sequence[RabbitNode]) -> None:
    """Remove the cut, if any (no error without one, or without nft)."""
    nft = _nft(ensure=False)
    if nft is None or not is_cut(nodes):
        return
    run([nft, "delete", "table", _FAMILY, table_name(nodes)])
    log(f"partition: healed ({table_name(nodes)} removed)")
