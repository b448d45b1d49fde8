"""Local infrastructure for development, tests and CI: RabbitMQ and PostgreSQL.

Both servers run as plain processes under one base folder (default ``<repo>/.run/``), never as
system services, listening on 127.0.0.1 only. Standard library only, so it works before the
project is installed (``make infra-up`` runs it with the system ``python3``). RabbitMQ is the
series ``$ORCH_RABBITMQ`` names (``make ... RABBITMQ=4.0``; 4.3 by default), from Debian's
package: the host's own (3.10) or a newer release's, run inside a root of that release
(``brokers``; docs/broker-versions.md). PostgreSQL is the series ``$ORCH_POSTGRES`` names
(``make ... POSTGRES=17``; 15, the host's, by default), likewise (``pg_series``).

CLI (``__main__``)::

    python -m tools.infra up       # install packages if missing, start both, write <base>/env
    python -m tools.infra down     # stop both (data stays on disk)
    python -m tools.infra status   # print running / not running (exit status 3 if not both up)
    python -m tools.infra env      # print <base>/env
    python -m tools.infra destroy  # stop both and delete all their data
    python -m tools.infra promtool check rules FILE  # Debian's promtool, unpacked on first use

Modules: ``system`` (commands, processes, ports, files), ``packages`` (Debian packages),
``brokers`` (the supported RabbitMQ series and where each runs), ``roots`` (Debian roots made by
``debootstrap`` and commands run inside them), ``pg_series`` (PostgreSQL 15 or 17 and where
each runs), ``rabbitmq``
(``RabbitNode``), ``cluster`` (a cluster's nodes), ``partition`` (one of them cut off from
the others, with nftables), ``postgres`` (``PostgresNode``), ``pg_pair`` (a primary and its
streaming replica, for the failover test), ``conflicts`` (who holds a node name or a port we
need), ``state`` (ports and passwords in ``infra.json``, the env file, the lock), ``stack``
(``up`` / ``down`` / ``status`` / ``destroy`` of both), ``promtool`` (Debian's promtool for
the checks of ``deploy/prometheus/``).

Layout of the base folder::

    infra.json          chosen ports and generated passwords (reused by every later ``up``)
    env                 ORCH_AMQP_URL=... / ORCH_DATABASE_URL=... (shell-sourceable)
    rabbitmq-<series>/  RabbitNode.base: rabbitmq.conf, advanced.config, enabled_plugins,
                        <name>.pid, .erlang.cookie, mnesia/, log/ (console.log, <node>.log);
                        one per series (one runs at a time: same node name and ports)
    cluster-<series>/   a cluster's nodes (``BROKER_NODES=3``, ``cluster``): cluster.json (names,
                        ports, the shared cookie) and n1/, n2/, ... (each a RabbitNode.base)
    brokers/<suite>/    a Debian root with that release's rabbitmq-server (4.0: trixie,
                        4.3: sid), made once by debootstrap and reused
    pg-roots/trixie/    a Debian trixie root with postgresql-17 (PostgreSQL 17), made once
    promtool/           Debian's prometheus package unpacked (usr/bin/promtool only is used)
    postgres/pg/        PostgresNode (15): data/, run/ (unix socket), log/postgres.log; owned by
                        the ``postgres`` user; a symlink to /var/tmp/orch-pg-<hash>/ when the
                        ``postgres`` user cannot reach the base folder
    postgres-17/pg/     the same for 17, owned by the root's ``postgres`` account (its uid)

Progress messages go to stderr; ``up`` and ``env`` print the env lines on stdout.
"""

from tools.infra.conflicts import epmd_names
from tools.infra.packages import ensure_packages, no_service_starts
from tools.infra.postgres import PostgresNode
from tools.infra.rabbitmq import RabbitNode
from tools.infra.stack import broker_cluster, destroy, down, env_lines, postgres_node, rabbit_node, status, up
from tools.infra.state import DEFAULT_AMQP_PORT, DEFAULT_BASE, DEFAULT_DIST_PORT, DEFAULT_PG_PORT
from tools.infra.system import InfraError, port_is_free, run

__all__ = [
    "DEFAULT_AMQP_PORT",
    "DEFAULT_BASE",
    "DEFAULT_DIST_PORT",
    "DEFAULT_PG_PORT",
    "InfraError",
    "PostgresNode",
    "RabbitNode",
    "broker_cluster",
    "destroy",
    "down",
    "ensure_packages",
    "env_lines",
    "epmd_names",
    "no_service_starts",
    "port_is_free",
    "postgres_node",
    "rabbit_node",
    "run",
    "status",
    "up",
]
