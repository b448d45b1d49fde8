"""Both servers of one base folder together: ``up`` (install, start or reuse, write the env
file), ``down``, ``destroy``, ``status``, and the nodes as ``infra.json`` describes them.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TextIO

from tools.infra import cluster, partition, pg_series
from tools.infra.brokers import RELEASES, ensure_installed, install_for, selected_series
from tools.infra.packages import ensure_packages
from tools.infra.postgres import PostgresNode
from tools.infra.rabbitmq import RabbitNode
from tools.infra.state import (
    DEFAULT_AMQP_PORT,
    DEFAULT_DIST_PORT,
    DEFAULT_PG_PORT,
    DEFAULT_USER,
    env_file,
    int_field,
    load_state,
    locked,
    move_port,
    new_password,
    resolve_base,
    save_state,
    str_field,
    write_env,
)
from tools.infra.system import LOOPBACK, log


def pg_base(base: Path, series: str) -> Path:
    """The PostgreSQL node's folder of ``series``: each keeps data of its own (a server reads
    no other major version's data); 15's is ``postgres/``, as before there was a choice."""
    return base / ("postgres" if series == pg_series.DEFAULT_SERIES else f"postgres-{series}")


def nodes(
    base: Path, *, allocate: bool, series: str | None = None, pg: str | None = None
) -> tuple[RabbitNode, PostgresNode]:
    """Nodes described by ``<base>/infra.json``; with ``allocate``, fix ports and save.
    ``series``: which RabbitMQ (default: ``$ORCH_RABBITMQ``, else the newest); ``pg``: which
    PostgreSQL (default: ``$ORCH_POSTGRES``, else 15). One port for every PostgreSQL series:
    one runs at a time."""
    state = load_state(base)
    rabbit_state = state.get("rabbitmq", {})
    pg_state = state.get("postgres", {})
    series = series or selected_series()
    pg_chosen = pg or pg_series.selected_series()
    # Erlang node names are machine-wide (epmd): one per base folder. A checkout deleted and
    # cloned again at the same path gets the same name; RabbitNode.start names a leftover node.
    default_name = "orch-" + hashlib.sha256(str(base).encode()).hexdigest()[:6]
    rabbit = RabbitNode(
        name=str_field(rabbit_state, "name", default_name),
        # Each series keeps data of its own: a node reads no other series' data.
        base=base / f"rabbitmq-{series}",
        install=install_for(series, base),
        port=int_field(rabbit_state, "port", DEFAULT_AMQP_PORT),
        dist_port=int_field(rabbit_state, "dist_port", DEFAULT_DIST_PORT),
        user=str_field(rabbit_state, "user", DEFAULT_USER),
        password=str_field(rabbit_state, "password", "") or new_password(),
    )
    postgres = PostgresNode(
        base=pg_base(base, pg_chosen),
        install=pg_series.install_for(pg_chosen, base),
        port=int_field(pg_state, "port", DEFAULT_PG_PORT),
        user=str_field(pg_state, "user", DEFAULT_USER),
        password=str_field(pg_state, "password", "") or new_password(),
    )
    if not allocate:
        return rabbit, postgres
    taken: set[int] = set()
    if rabbit.is_running():
        taken |= {rabbit.port, rabbit.dist_port}
    if postgres.is_running():
        taken.add(postgres.port)
    else:
        postgres.port = move_port(postgres.port, taken, "postgres")
        taken.add(postgres.port)
    if not rabbit.is_running():
        rabbit.port = move_port(rabbit.port, taken, "rabbitmq AMQP")
        taken.add(rabbit.port)
        rabbit.dist_port = move_port(rabbit.dist_port, taken, "rabbitmq distribution")
    new_state = {
        "rabbitmq": {
            "name": rabbit.name,
            "port": rabbit.port,
            "dist_port": rabbit.dist_port,
            "user": rabbit.user,
            "password": rabbit.password,
        },
        "postgres": {"port": postgres.port, "user": postgres.user, "password": postgres.password},
    }
    if new_state != state:
        save_state(base, new_state)
    return rabbit, postgres


def _series_nodes(base: Path, but: str | None = None) -> list[RabbitNode]:
    """The nodes of every series this base folder has data of (but ``but``)."""
    found = []
    for series in RELEASES:
        if series != but and (base / f"rabbitmq-{series}").exists():
            found.append(nodes(base, allocate=False, series=series)[0])
    return found


def _pg_nodes(base: Path, but: str | None = None) -> list[PostgresNode]:
    """The PostgreSQL nodes of every series this base folder has data of (but ``but``)."""
    return [
        nodes(base, allocate=False, pg=series)[1]
        for series in pg_series.RELEASES
        if series != but and pg_base(base, series).exists()
    ]


def _clusters(base: Path) -> list[list[RabbitNode]]:
    """The nodes of each cluster this base folder has data of."""
    found = []
    for series, count in cluster.saved_counts(base).items():
        if series in RELEASES:
            found.append(cluster.members(nodes(base, allocate=False, series=series)[0], count, base, allocate=False))
    return found


def _cluster_nodes(base: Path) -> list[RabbitNode]:
    """The nodes of every cluster this base folder has data of, each cluster healed of any cut
    a test left (``partition``): a cut node would not stop in time, nor boot into its cluster."""
    found = []
    for members in _clusters(base):
        partition.heal(members)
        found += members
    return found


def broker_cluster(count: int = 3, base: Path | None = None, *, install: bool = True) -> list[RabbitNode]:
    """Start (or reuse) a cluster of ``count`` nodes of the selected series under ``base``,
    beside the single node, without touching the env file; returns its nodes."""
    base = resolve_base(base)
    with locked(base):
        series = selected_series()
        if install:
            ensure_packages()
            ensure_installed(install_for(series, base))
        single = nodes(base, allocate=True, series=series)[0]
        brokers = cluster.members(single, count, base, allocate=True)
        partition.heal(brokers)  # a cut left by a test killed before its cleanup
        cluster.start(brokers)
    return brokers


def rabbit_node(base: Path | None = None) -> RabbitNode:
    """The project's RabbitMQ node under ``base`` (ports/password from ``infra.json``)."""
    base = resolve_base(base)
    with locked(base):
        return nodes(base, allocate=True)[0]


def postgres_node(base: Path | None = None) -> PostgresNode:
    """The project's PostgreSQL node under ``base`` (port/password from ``infra.json``)."""
    base = resolve_base(base)
    with locked(base):
        return nodes(base, allocate=True)[1]


def env_lines(
    rabbit: RabbitNode, pg: PostgresNode, database: str = "orch", brokers: list[RabbitNode] | None = None
) -> list[str]:
    """The env file's lines; with a cluster (``brokers``), ``ORCH_AMQP_URLS`` lists every
    node, ``ORCH_AMQP_URL`` is the first, and the queues are quorum queues."""
    first = brokers[0] if brokers else rabbit
    lines = [f"ORCH_AMQP_URL={shlex.quote(first.url)}"]
    if brokers:
        lines.append(f"ORCH_AMQP_URLS={shlex.quote(','.join(node.url for node in brokers))}")
        lines.append("ORCH_QUEUE_TYPE=quorum")  # docs/design.md, "On a RabbitMQ cluster"
        lines.append(f"ORCH_BROKER_METRICS_URLS={shlex.quote(','.join(node.metrics_url for node in brokers))}")
    return [*lines, f"ORCH_DATABASE_URL={shlex.quote(pg.url(database))}"]


def up(base: Path | None = None, *, install: bool = True) -> dict[str, str]:
    """Start (or reuse) both servers, create database ``orch``, write ``<base>/env``."""
    base = resolve_base(base)
    began = time.monotonic()
    with locked(base):
        series = selected_series()
        # One node name and one set of ports per base folder: another series' node yields.
        for other in _series_nodes(base, but=series):
            if other.live_pid() is not None:
                log(f"stopping RabbitMQ {other.install.series} ({other.node}): RabbitMQ {series} was asked for")
                other.stop()
        pg_chosen = pg_series.selected_series()
        for other_pg in _pg_nodes(base, but=pg_chosen):
            if other_pg.live_pid() is not None:
                log(f"stopping PostgreSQL {other_pg.install.series}: PostgreSQL {pg_chosen} was asked for")
                other_pg.stop()
        if install:
            ensure_packages()
            ensure_installed(install_for(series, base))
            pg_series.ensure_installed(pg_series.install_for(pg_chosen, base))
        rabbit, pg = nodes(base, allocate=True, series=series, pg=pg_chosen)
        count = cluster.selected_count()
        brokers = cluster.members(rabbit, count, base, allocate=True) if count > 1 else None
        # RabbitMQ boots in several seconds: start PostgreSQL meanwhile.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rabbitmq-start") as pool:
            rabbit_started = pool.submit(rabbit.start if brokers is None else lambda: cluster.start(brokers))
            pg.start()
            pg.create_database("orch")
            rabbit_started.result()
        lines = env_lines(rabbit, pg, brokers=brokers)
        write_env(base, lines)
    log(f"up in {time.monotonic() - began:.1f}s; env written to {env_file(base)}")
    return dict(line.split("=", 1) for line in lines)


def down(base: Path | None = None) -> None:
    """Stop both servers gracefully (data stays)."""
    base = resolve_base(base)
    if not (base / "infra.json").exists():
        log(f"nothing to stop: no {base / 'infra.json'}")
        return
    with locked(base):
        for rabbit in _series_nodes(base) + _cluster_nodes(base):
            rabbit.stop()
        for pg in _pg_nodes(base):
            pg.stop()


def destroy(base: Path | None = None) -> None:
    """Kill both servers and delete ``base`` (all data, ports, passwords)."""
    base = resolve_base(base)
    if (base / "infra.json").exists():
        with locked(base):
            for rabbit in _series_nodes(base) + _cluster_nodes(base):
                rabbit.destroy()
            for pg in _pg_nodes(base):
                pg.destroy()
    shutil.rmtree(base, ignore_errors=True)
    log(f"removed {base}")


def status(base: Path | None = None, out: TextIO | None = None) -> dict[str, bool]:
    """Print and return whether each server runs."""
    base = resolve_base(base)
    out = out or sys.stdout
    if not (base / "infra.json").exists():
        print(f"rabbitmq: not running\npostgres: not running\n(no {base / 'infra.json'})", file=out)
        return {"rabbitmq": False, "postgres": False}
    rabbit, pg = nodes(base, allocate=False)
    result = {"rabbitmq": rabbit.is_running(), "postgres": pg.is_running()}
    print(
        f"rabbitmq: {'running' if result['rabbitmq'] else 'not running'}"
        f" (RabbitMQ {rabbit.install.series}, node {rabbit.node}, amqp {LOOPBACK}:{rabbit.port}, base {rabbit.base})",
        file=out,
    )
    print(
        f"postgres: {'running' if result['postgres'] else 'not running'}"
        f" (PostgreSQL {pg.install.series}, {LOOPBACK}:{pg.port}, base {pg.base})",
        file=out,
    )
    return result
