"""A cluster of RabbitMQ nodes of the selected series, for ``BROKER_NODES=3`` (issue 55).

Its nodes are apart from the single node (``rabbitmq-<series>/``): a node whose data says it
is clustered waits at boot for a majority of its peers (Khepri), so one set of data never
serves both. Under ``<base>/cluster-<series>/``: ``cluster.json`` (names, ports, the shared
Erlang cookie) and ``n1/``, ``n2/``, ... (each a ``RabbitNode``'s folder). The nodes find
each other by ``classic_config`` peer discovery, as compose's cluster variant does, with the
user and password of the single node and the project's broker settings. Each member opens
its distribution connections from a loopback address of its own (``dist_source``), which
``partition`` uses to cut one member off from the others.
"""

from __future__ import annotations

import json
import os
import secrets
import string
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

from tools.infra.brokers import install_for
from tools.infra.rabbitmq import SHIPPED, RabbitNode
from tools.infra.state import DEFAULT_AMQP_PORT, DEFAULT_DIST_PORT, move_port
from tools.infra.system import InfraError, log, write_private

NODES_ENV = "ORCH_BROKER_NODES"
# What a cluster runs on top of the single node's settings (compose's cluster variant too).
SHIPPED_CLUSTER = SHIPPED / "cluster.conf"
MAX_NODES = 7
# Ports of member i: above the single node's, so both may run.
_AMQP_FROM = DEFAULT_AMQP_PORT + 10
_DIST_FROM = DEFAULT_DIST_PORT + 10
# Each member serves its net_ticktime to the services from RabbitMQ's Prometheus plugin.
_PROMETHEUS_FROM = 15692 + 10


def dist_source(i: int) -> str:
    """Member i's own loopback address for its outgoing distribution connections (127.0.0.1i):
    what lets ``partition`` cut that member off from the others and nothing else."""
    return f"127.0.0.{10 + i}"


def selected_count() -> int:
    """How many broker nodes ``$ORCH_BROKER_NODES`` asks for (``make ... BROKER_NODES=3``)."""
    raw = os.environ.get(NODES_ENV, "").strip() or "1"
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_NODES:
        raise InfraError(f"BROKER_NODES must be a number from 1 to {MAX_NODES}, not {raw!r}")
    return int(raw)


def members(single: RabbitNode, count: int, base: Path, *, allocate: bool) -> list[RabbitNode]:
    """The ``count`` nodes of the cluster of ``single``'s series and credentials; with
    ``allocate``, free ports are chosen (and kept in ``cluster.json``) for nodes not running."""
    series = single.install.series
    folder = base / f"cluster-{series}"
    saved = _load(folder)
    cookie = str(saved.get("cookie") or "".join(secrets.choice(string.ascii_uppercase) for _ in range(24)))
    names = [f"{single.name}-c{i}" for i in range(1, count + 1)]
    ports = cast(dict[str, list[int]], saved.get("ports", {}))
    peers = "\n".join(f"cluster_formation.classic_config.nodes.{i} = {n}@localhost" for i, n in enumerate(names, 1))
    nodes = []
    taken: set[int] = {single.port, single.dist_port}
    for i, name in enumerate(names, 1):
        amqp, dist, prometheus = [*ports.get(name, [_AMQP_FROM + i, _DIST_FROM + i]), _PROMETHEUS_FROM + i][:3]
        node = RabbitNode(
            name=name,
            base=folder / f"n{i}",
            port=amqp,
            dist_port=dist,
            user=single.user,
            password=single.password,
            cookie=cookie,
            install=install_for(series, base),
            dist_source=dist_source(i),
            prometheus_port=prometheus,
            extra_conf=f"cluster_formation.peer_discovery_backend = classic_config\n{peers}\n\n"
            f"# {SHIPPED_CLUSTER.name}\n{SHIPPED_CLUSTER.read_text().strip()}",
        )
        if allocate and not node.is_running():
            node.port = move_port(node.port, taken, f"rabbitmq {name} AMQP")
            taken.add(node.port)
            node.dist_port = move_port(node.dist_port, taken, f"rabbitmq {name} distribution")
            taken.add(node.dist_port)
            node.prometheus_port = move_port(node.prometheus_port, taken, f"rabbitmq {name} Prometheus")
        taken |= {node.port, node.dist_port, node.prometheus_port}
        nodes.append(node)
    if allocate:
        ports = {n.name: [n.port, n.dist_port, n.prometheus_port] for n in nodes}
        _save(folder, {"cookie": cookie, "ports": ports})
    return nodes


def start(nodes: list[RabbitNode]) -> None:
    """Start every node at once (each waits at boot for its peers) and wait for all."""
    with ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="rabbitmq-cluster") as pool:
        for started in [pool.submit(node.start) for node in nodes]:
            started.result()
    running = nodes[0].ctl("cluster_status", "--formatter", "json")
    joined = json.loads(running[running.index("{") :]).get("running_nodes", [])
    if len(joined) != len(nodes):
        raise InfraError(f"the cluster formed with {len(joined)} of {len(nodes)} nodes running: {joined}")
    log(f"rabbitmq cluster of {len(nodes)} running: {', '.join(joined)}")


def saved_counts(base: Path) -> dict[str, int]:
    """Series -> how many nodes its cluster has, for every cluster this base has data of."""
    found = {}
    for folder in sorted(base.glob("cluster-*")):
        ports = _load(folder).get("ports")
        if isinstance(ports, dict) and ports:
            found[folder.name.removeprefix("cluster-")] = len(ports)
    return found


def _load(folder: Path) -> dict[str, object]:
    try:
        loaded: dict[str, object] = json.loads((folder / "cluster.json").read_text())
        return loaded
    except (OSError, ValueError):
        return {}


def _save(folder: Path, state: dict[str, object]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_private(folder / "cluster.json", json.dumps(state, indent=2) + "\n")
