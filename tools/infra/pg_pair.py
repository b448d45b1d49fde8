"""A PostgreSQL primary and its streaming replica under one folder, for the failover test
(``tests/system/test_db_failover.py``): what production runs behind a switchover tool, with
the switchover done by hand.

The primary is made like the project's own node (``PostgresNode``: initdb, auth, loopback
port, socket folder); the replica is its ``pg_basebackup -R`` clone on a port of its own.
``kill_primary`` is a crashed host (``kill -9`` of the postmaster and its backends) and
``promote`` is the switchover tool's move (``pg_ctl promote``).

Replication is synchronous (``synchronous_standby_names = '*'``, set on the primary only, so
the promoted replica does not wait for a standby it lacks): a commit the primary acknowledged
is on the replica. With asynchronous streaming the last commits before a crash may be missing
from the promoted node, a loss of the database's own that no client can prevent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from tools.infra.postgres import PostgresNode
from tools.infra.system import LOOPBACK, InfraError, log, wait_until

_SUPERUSER = "postgres"  # what initdb made; the replication connection uses it (peer auth)


@dataclass
class StandbyNode(PostgresNode):
    """A node whose data, the role and its password among them, comes from its primary."""

    def _ensure_role(self) -> None:
        # A standby refuses ALTER ROLE (read-only), and the primary's role came with the clone.
        return

    def clone_from(self, primary: PostgresNode) -> None:
        """``pg_basebackup -R`` of ``primary`` into this node's (empty) data folder: the data
        and ``standby.signal`` with ``primary_conninfo`` over the primary's unix socket."""
        # In a root (PostgreSQL 17), the replica's processes see the primary's socket folder
        # only if it is bound in: pg_basebackup now, the WAL receiver for as long as it runs.
        self.binds = (primary.socket_dir,)
        self._prepare()
        if (self.data_dir / "PG_VERSION").exists():
            raise InfraError(f"{self.data_dir} already holds a cluster")
        self.run_tool(
            "pg_basebackup",
            "-D",
            str(self.data_dir),
            "-h",
            str(primary.socket_dir),
            "-p",
            str(primary.port),
            "-U",
            _SUPERUSER,
            "-X",
            "stream",
            "-c",
            "fast",
            "-R",
            "-w",
            timeout=300,
        )

    def in_recovery(self) -> bool:
        return self.psql("SELECT pg_is_in_recovery()").strip() == "t"


class PgPair:
    """A primary on ``ports[0]`` and its synchronous streaming replica on ``ports[1]``, both
    under ``base``, one superuser login (``user``/``password``) for clients."""

    def __init__(self, base: Path, ports: tuple[int, int]) -> None:
        self.primary = PostgresNode(base / "primary", ports[0])
        self.replica = StandbyNode(base / "replica", ports[1], user=self.primary.user, password=self.primary.password)

    def url(self, database: str = "orch", target_session_attrs: str = "read-write") -> str:
        """SQLAlchemy's multi-host URL naming both nodes, the primary first."""
        hosts = "&".join(f"host={LOOPBACK}:{node.port}" for node in (self.primary, self.replica))
        user, password = quote(self.primary.user, safe=""), quote(self.primary.password, safe="")
        return (
            f"postgresql+asyncpg://{user}:{password}@/{quote(database, safe='')}"
            f"?{hosts}&target_session_attrs={target_session_attrs}"
        )

    def start(self, database: str = "orch") -> None:
        """Start the primary with ``database``, clone and start the replica, and wait until
        it streams synchronously."""
        self.primary.start()
        self.primary.create_database(database)
        self.replica.clone_from(self.primary)
        self.replica.start()
        if not wait_until(lambda: self._replication() == "streaming async", 60, every=0.1):
            raise InfraError(f"the replica does not stream (pg_stat_replication: {self._replication()!r})")
        self.primary.psql("ALTER SYSTEM SET synchronous_standby_names = '*';\nSELECT pg_reload_conf();\n")
        if not wait_until(lambda: self._replication() == "streaming sync", 60, every=0.1):
            raise InfraError(f"the replica is not synchronous (pg_stat_replication: {self._replication()!r})")
        log(f"postgres pair: primary :{self.primary.port}, synchronous replica :{self.replica.port}")

    def _replication(self) -> str:
        return self.primary.psql("SELECT state || ' ' || sync_state FROM pg_stat_replication").strip()

    def kill_primary(self) -> None:
        """``kill -9`` of the primary's postmaster and its backends: the host crashed."""
        self.primary.kill()

    def promote(self) -> None:
        """Promote the replica and return once it takes writes (``pg_ctl promote`` waits)."""
        self.replica.run_tool("pg_ctl", "-D", str(self.replica.data_dir), "-w", "-t", "60", "-s", "promote", timeout=90)
        if self.replica.in_recovery():
            raise InfraError("the replica is still in recovery after pg_ctl promote")
        log(f"postgres pair: replica :{self.replica.port} promoted")

    def destroy(self) -> None:
        """Kill both servers and delete their data."""
        self.replica.destroy()
        self.primary.destroy()
