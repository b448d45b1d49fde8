"""A PostgreSQL cluster owned by the ``postgres`` OS user, run with ``pg_ctl`` as a plain
process: data, unix socket and log under one folder (or under /var/tmp when the ``postgres``
user cannot reach it or the socket path would be too long).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from tools.infra import conflicts
from tools.infra.pg_series import PG_OS_USER, SYS_PATH, PgInstall, default_install
from tools.infra.state import DEFAULT_USER, new_password
from tools.infra.system import (
    LOOPBACK,
    InfraError,
    cmdline,
    kill_tree,
    log,
    pid_alive,
    port_is_free,
    run,
    tail,
    wait_gone,
    write_private,
)
from tools.infra.tls import TlsFiles

# What PostgreSQL's defaults (shared_buffers 128MB, max_wal_size 1GB) cost at scale: a
# 1,000,000-observer fleet's tables and indexes are ~1.1 GB, and a failover rewrites a third
# of their rows, scattered by id over every page. With 128 MB of buffers nearly every row
# moved evicted a dirty page and read another back from the OS; with 1 GB of WAL a checkpoint
# started within the failover and made every page touched after it log its whole image again.
# Written on every start (orch.conf), so an existing cluster picks them up at its next start.
TUNING = {
    "shared_buffers": "1GB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "15min",
}
PG_FALLBACK_ROOT = Path("/var/tmp")
# sun_path is 108 bytes; keep room for "/.s.PGSQL.65535".
_MAX_SOCKET_DIR = 90


def _pg_env() -> dict[str, str]:
    return {"PATH": SYS_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@dataclass
class PostgresNode:
    """A PostgreSQL cluster owned by the postgres OS user, listening on 127.0.0.1:``port``.

    ``user`` is a LOGIN SUPERUSER whose password is (re)set to ``password`` on every start;
    administration goes through the unix socket as the ``postgres`` role (peer auth).
    """

    base: Path
    port: int
    user: str = DEFAULT_USER
    password: str = field(default_factory=new_password, repr=False)
    start_timeout: float = 60.0
    # With ``tls``: ``ssl = on``, and a TCP client over TLS must present a certificate signed
    # by ``tls.ca`` (``clientcert=verify-ca``); with ``tls_only`` (the default) no other TCP
    # client is taken (``hostssl`` only). The socket stays peer.
    tls: TlsFiles | None = None
    tls_only: bool = True
    # Which PostgreSQL (``pg_series``): the host's 15 or a newer one inside a root.
    install: PgInstall = field(default_factory=default_install)
    # Folders of the host a server in a root must see besides its own (a replica: its
    # primary's socket folder).
    binds: tuple[Path, ...] = ()

    # ----- paths

    @property
    def pg_link(self) -> Path:
        """``<base>/pg``: the folder (or symlink to it) holding data/, run/, log/."""
        return self.base / "pg"

    @property
    def root(self) -> Path:
        """Real (symlink-resolved) path of :attr:`pg_link`, as the postgres user sees it."""
        return self.pg_link.resolve()

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"

    @property
    def log_file(self) -> Path:
        return self.root / "log" / "postgres.log"

    def url(self, database: str = "orch") -> str:
        return (
            f"postgresql+asyncpg://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
            f"@{LOOPBACK}:{self.port}/{quote(database, safe='')}"
        )

    # ----- running as the postgres account

    def _ids(self) -> tuple[int, int]:
        return self.install.ids()

    def _as_postgres(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run as the postgres account (inside the root, seeing this node's folder)."""
        return self.install.command(argv, [self.root, *self.binds])

    def _postgres_can_reach(self, path: Path) -> bool:
        """True if the postgres account can traverse ``path`` and every folder above it (in a
        root, the folders above are the root's own, made for the bind)."""
        if self.install.root is not None:
            return True
        try:
            run(self.install.command(["test", "-x", str(path)]), env=_pg_env(), timeout=30)
        except InfraError:
            return False
        return True

    # ----- setup

    def _fallback_root(self) -> Path:
        digest = hashlib.sha256(str(self.base.resolve()).encode()).hexdigest()[:10]
        return PG_FALLBACK_ROOT / f"orch-pg-{digest}"

    def _prepare(self) -> None:
        uid, gid = self._ids()
        self.base.mkdir(parents=True, exist_ok=True)
        link = self.pg_link
        if link.is_symlink():
            target = link.resolve()
            if not target.exists():
                target.mkdir(parents=True, mode=0o755)
                os.chown(target, uid, gid)
        elif not link.exists():
            resolved = self.base.resolve() / "pg"
            short = len(str(resolved / "run")) <= _MAX_SOCKET_DIR
            if short and self._postgres_can_reach(self.base):
                link.mkdir(mode=0o755)
                os.chown(link, uid, gid)
            else:
                target = self._fallback_root()
                target.mkdir(mode=0o755, exist_ok=True)
                os.chown(target, uid, gid)
                link.symlink_to(target, target_is_directory=True)
                reason = f"user {PG_OS_USER} cannot traverse {self.base}"
                if not short:
                    reason = f"{resolved / 'run'} is too long for a unix socket path"
                log(f"postgres: {reason}; data kept in {target} (symlink {link})")
        for sub, mode in (("data", 0o700), ("run", 0o755), ("log", 0o755)):
            path = self.root / sub
            if not path.exists():
                path.mkdir(mode=mode)
                os.chown(path, uid, gid)

    def _bin(self, program: str) -> str:
        if not self.install.present():
            where = self.install.root or "the host"
            raise InfraError(
                f"PostgreSQL {self.install.series} is not installed ({where}): "
                "run tools.infra.up() (make infra-up), which installs it"
            )
        return str(self.install.bin_dir / program)

    def _initdb(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        if any(self.data_dir.iterdir()):
            log(f"postgres: removing incomplete cluster in {self.data_dir}")
            shutil.rmtree(self.data_dir)
            uid, gid = self._ids()
            self.data_dir.mkdir(mode=0o700)
            os.chown(self.data_dir, uid, gid)
        log(f"postgres: initdb {self.data_dir}")
        run(
            self._as_postgres(
                [
                    self._bin("initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    PG_OS_USER,
                    "--auth-local=peer",
                    "--auth-host=scram-sha-256",
                    "--encoding=UTF8",
                    "--no-locale",
                ]
            ),
            env=_pg_env(),
            timeout=300,
        )
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# tools/infra/postgres.py: port, addresses and socket folder\ninclude = 'orch.conf'\n")

    def _write_conf(self) -> None:
        uid, gid = self._ids()
        conf = self.data_dir / "orch.conf"
        write_private(
            conf,
            "# Written by tools/infra/postgres.py on every start.\n"
            f"listen_addresses = '{LOOPBACK}'\n"
            f"port = {self.port}\n"
            f"unix_socket_directories = '{self.socket_dir}'\n"
            + "".join(f"{name} = '{value}'\n" for name, value in TUNING.items())
            + self._tls_conf(),
        )
        os.chown(conf, uid, gid)

    def _tls_conf(self) -> str:
        """With ``tls``: the files copied where the server may read them, and a pg_hba.conf
        that takes TCP clients over TLS with a certificate (and, unless ``tls_only``, plain
        ones with a password)."""
        if self.tls is None:
            return ""
        uid, gid = self._ids()
        files = self.tls.copy_to(self.data_dir / "tls", owner=(uid, gid))
        os.chown(self.data_dir / "tls", uid, gid)
        hba = self.data_dir / "pg_hba.conf"
        write_private(
            hba,
            "# Written by tools/infra/postgres.py (PostgresNode.tls): TLS with a client certificate only.\n"
            "local all all peer\n"
            f"hostssl all all {LOOPBACK}/32 scram-sha-256 clientcert=verify-ca\n"
            + ("" if self.tls_only else f"hostnossl all all {LOOPBACK}/32 scram-sha-256\n"),
        )
        os.chown(hba, uid, gid)
        return f"ssl = on\nssl_ca_file = '{files.ca}'\nssl_cert_file = '{files.cert}'\nssl_key_file = '{files.key}'\n"

    # ----- process state

    def _postmaster(self) -> tuple[int, str] | None:
        """(pid, status) from postmaster.pid when that pid is alive and is a postgres process."""
        if not self.pg_link.exists():
            return None
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            return None
        if not pid_alive(pid) or "postgres" not in cmdline(pid):
            return None
        return pid, (lines[7].strip() if len(lines) > 7 else "")

    def live_pid(self) -> int | None:
        """The postmaster's pid, if this cluster runs (its backends are its children)."""
        found = self._postmaster()
        return found[0] if found else None

    def is_running(self) -> bool:
        """The postmaster of this data folder is alive and reports ``ready``."""
        state = self._postmaster()
        return state is not None and state[1] == "ready"

    def run_tool(self, program: str, *args: str, timeout: float = 120) -> str:
        """Run one of PostgreSQL's programs (``pg_ctl``, ``pg_basebackup``, ...) as the
        postgres OS user, for code that drives a node beyond start and stop (``pg_pair``)."""
        return run(self._as_postgres([self._bin(program), *args]), env=_pg_env(), timeout=timeout)

    # ----- SQL

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` as the postgres superuser over the unix socket; return unaligned rows."""
        return run(
            self._as_postgres(
                [
                    self._bin("psql"),
                    "-X",
                    "-q",
                    "-A",
                    "-t",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-h",
                    str(self.socket_dir),
                    "-p",
                    str(self.port),
                    "-U",
                    PG_OS_USER,
                    "-d",
                    database,
                    "-f",
                    "-",
                ]
            ),
            env=_pg_env(),
            input_text=sql,
            timeout=120,
        )

    def _ensure_role(self) -> None:
        user = _quote_literal(self.user)
        self.psql(
            f"SELECT format('CREATE ROLE %I LOGIN SUPERUSER', {user})"
            f" WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {user}) \\gexec\n"
            f"ALTER ROLE {_quote_ident(self.user)} WITH LOGIN SUPERUSER"
            f" PASSWORD {_quote_literal(self.password)};\n"
        )

    def create_database(self, name: str, template: str | None = None) -> None:
        """CREATE DATABASE ``name`` owned by ``user`` unless it exists (``template`` optional)."""
        fmt = "CREATE DATABASE %I OWNER %I" + (" TEMPLATE %I" if template else "")
        args = [_quote_literal(name), _quote_literal(self.user)]
        if template:
            args.append(_quote_literal(template))
        self.psql(
            f"SELECT format({_quote_literal(fmt)}, {', '.join(args)})"
            f" WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = {args[0]}) \\gexec\n"
        )

    def drop_database(self, name: str) -> None:
        """DROP DATABASE ``name`` if it exists, disconnecting its sessions."""
        self.psql(f"DROP DATABASE IF EXISTS {_quote_ident(name)} WITH (FORCE);\n")

    # ----- lifecycle

    def start(self) -> None:
        """Create the cluster if needed and start it, or reuse it if already running."""
        if self.is_running():
            self._ensure_role()
            log(f"postgres already running on {LOOPBACK}:{self.port} (reused)")
            return
        began = time.monotonic()
        self._bin("postgres")
        self._prepare()
        state = self._postmaster()
        if state is not None:
            log(f"postgres (pid {state[0]}) is {state[1] or 'busy'}; stopping it first")
            self.stop()
        if not port_is_free(self.port):
            found = conflicts.listening_holder(self.port)
            raise InfraError(conflicts.port_taken("postgres: port", self.port, found))
        # After a crash the lock file names a dead (or zombie: PID 1 may not reap) process;
        # postgres itself only checks kill(pid, 0), which succeeds on a zombie.
        (self.data_dir / "postmaster.pid").unlink(missing_ok=True)
        self._initdb()
        self._write_conf()
        try:
            run(
                self._as_postgres(
                    [
                        self._bin("pg_ctl"),
                        "-D",
                        str(self.data_dir),
                        "-l",
                        str(self.log_file),
                        "-w",
                        "-t",
                        str(int(self.start_timeout)),
                        "-s",
                        "start",
                    ]
                ),
                env=_pg_env(),
                timeout=self.start_timeout + 30,
                new_session=True,
            )
        except InfraError as exc:
            raise InfraError(f"{exc}\n--- {self.log_file}:\n{tail(self.log_file)}") from exc
        self._ensure_role()
        log(f"postgres started on {LOOPBACK}:{self.port} in {time.monotonic() - began:.1f}s")

    def stop(self) -> None:
        """``pg_ctl stop -m fast`` (clean shutdown, data stays). No error if not running."""
        state = self._postmaster()
        if state is None:
            log("postgres not running")
            return
        began = time.monotonic()
        run(
            self._as_postgres(
                [self._bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "-s", "stop"]
            ),
            env=_pg_env(),
            timeout=90,
        )
        wait_gone([state[0]], 30)
        log(f"postgres stopped in {time.monotonic() - began:.1f}s")

    def kill(self) -> None:
        """SIGKILL the postmaster and its children (a crash). No error if not running."""
        state = self._postmaster()
        if state is None:
            return
        pid = state[0]
        kill_tree(pid, "postgres")
        log(f"postgres killed (pid {pid})")

    def destroy(self) -> None:
        """Kill the server and delete its data (including a /var/tmp target of ``<base>/pg``)."""
        self.kill()
        if self.pg_link.is_symlink():
            shutil.rmtree(self.pg_link.resolve(), ignore_errors=True)
            self.pg_link.unlink()
        shutil.rmtree(self.base, ignore_errors=True)
