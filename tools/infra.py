"""Local infrastructure for development, tests and CI: RabbitMQ and PostgreSQL.

Both servers run as plain processes under one base folder (default ``<repo>/.run/``), never as
system services, listening on 127.0.0.1 only. Standard library only, so it works before the
project is installed.

CLI::

    python -m tools.infra up       # install packages if missing, start both, write <base>/env
    python -m tools.infra down     # stop both (data stays on disk)
    python -m tools.infra status   # print running / not running (exit status 3 if not both up)
    python -m tools.infra env      # print <base>/env
    python -m tools.infra destroy  # stop both and delete all their data

Layout of the base folder::

    infra.json          chosen ports and generated passwords (reused by every later ``up``)
    env                 ORCH_AMQP_URL=... / ORCH_DATABASE_URL=... (shell-sourceable)
    rabbitmq/           RabbitNode.base: rabbitmq.conf, advanced.config, enabled_plugins,
                        <name>.pid, .erlang.cookie, mnesia/, log/ (console.log, <node>.log)
    postgres/pg/        PostgresNode: data/, run/ (unix socket), log/postgres.log; owned by the
                        ``postgres`` user; a symlink to /var/tmp/orch-pg-<hash>/ when the
                        ``postgres`` user cannot reach the base folder

Progress messages go to stderr; ``up`` and ``env`` print the env lines on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import hashlib
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

__all__ = [
    "DEFAULT_AMQP_PORT",
    "DEFAULT_BASE",
    "DEFAULT_DIST_PORT",
    "DEFAULT_PG_PORT",
    "InfraError",
    "PostgresNode",
    "RabbitNode",
    "destroy",
    "down",
    "ensure_packages",
    "env_lines",
    "epmd_names",
    "main",
    "port_is_free",
    "postgres_node",
    "rabbit_node",
    "status",
    "up",
]

REPO = Path(__file__).resolve().parent.parent
DEFAULT_BASE = REPO / ".run"
BASE_ENV_VAR = "ORCH_INFRA_BASE"

DEFAULT_AMQP_PORT = 5682
DEFAULT_DIST_PORT = 25682
DEFAULT_PG_PORT = 5442
DEFAULT_USER = "orch"

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
RABBIT_SERVER = RABBIT_BIN / "rabbitmq-server"
RABBITMQCTL = RABBIT_BIN / "rabbitmqctl"
PG_OS_USER = "postgres"
PG_FALLBACK_ROOT = Path("/var/tmp")
# sun_path is 108 bytes; keep room for "/.s.PGSQL.65535".
_MAX_SOCKET_DIR = 90
_LOOPBACK = "127.0.0.1"
_ERL_LOOPBACK_ARGS = "-kernel inet_dist_use_interface {127,0,0,1}"
_SYS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Characters allowed in user names and passwords written into rabbitmq.conf.
_CONF_VALUE = re.compile(r"[A-Za-z0-9._~!$&*+,;=:@%^()\[\]{}|/?<>-]+")

_print_lock = threading.Lock()


class InfraError(RuntimeError):
    """A server could not be installed, started, stopped or queried."""


def _log(message: str) -> None:
    with _print_lock:
        print(f"[infra] {message}", file=sys.stderr, flush=True)


def _new_password() -> str:
    return secrets.token_urlsafe(24)


# --------------------------------------------------------------------------- processes / ports


def port_is_free(port: int, host: str = _LOOPBACK) -> bool:
    """True if nothing listens on ``host:port`` (a bind with SO_REUSEADDR succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _port_accepts(port: int, host: str = _LOOPBACK, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _pick_port(preferred: int, taken: set[int], span: int = 200) -> int:
    for port in range(preferred, min(preferred + span, 65536)):
        if port not in taken and port_is_free(port):
            return port
    raise InfraError(f"no free TCP port on {_LOOPBACK} in {preferred}..{preferred + span - 1}")


def epmd_names(port: int = 4369) -> dict[str, int]:
    """Erlang node names registered with the local epmd, with their distribution ports."""
    try:
        with socket.create_connection((_LOOPBACK, port), timeout=2.0) as sock:
            sock.sendall(b"\x00\x01n")  # NAMES_REQ
            chunks: list[bytes] = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
    except OSError:
        return {}
    names: dict[str, int] = {}
    for line in b"".join(chunks)[4:].decode(errors="replace").splitlines():
        match = re.fullmatch(r"name (\S+) at port (\d+)", line.strip())
        if match:
            names[match.group(1)] = int(match.group(2))
    return names


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # Field 3 (after the parenthesised command name) is the state; Z/X = dead.
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry.name))
    return found


def _wait_gone(pids: Sequence[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_pid_alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return not any(_pid_alive(pid) for pid in pids)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no {path})"
    return "\n".join(text.splitlines()[-lines:])


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    input_text: str | None = None,
    timeout: float = 120.0,
    cwd: Path | str = "/",
    new_session: bool = False,
) -> str:
    """Run a command, return stdout; raise InfraError with its output on failure."""
    try:
        proc = subprocess.run(
            list(argv),
            env=dict(env) if env is not None else None,
            input=input_text,
            stdin=None if input_text is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            start_new_session=new_session,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise InfraError(f"timed out after {timeout:.0f}s: {shlex.join(argv)}") from exc
    except OSError as exc:
        raise InfraError(f"cannot run {argv[0]}: {exc}") from exc
    if proc.returncode != 0:
        output = (proc.stderr.strip() + "\n" + proc.stdout.strip()).strip()
        raise InfraError(f"{shlex.join(argv)} exited with {proc.returncode}:\n{output}")
    return proc.stdout


def _write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Atomically write ``text`` to ``path`` with ``mode``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --------------------------------------------------------------------------- packages


def _pg_bin_dir() -> Path | None:
    """Newest /usr/lib/postgresql/<version>/bin holding a ``postgres`` binary."""
    found: list[tuple[int, Path]] = []
    for candidate in glob.glob("/usr/lib/postgresql/*/bin/postgres"):
        version = Path(candidate).parent.parent.name
        if version.isdigit():
            found.append((int(version), Path(candidate).parent))
    return max(found)[1] if found else None


@contextlib.contextmanager
def no_service_starts() -> Iterator[None]:
    """A temporary ``/usr/sbin/policy-rc.d`` (exit 101): packages installed meanwhile must not
    start their system services on these machines (we run our own servers on our own ports)."""
    policy = Path("/usr/sbin/policy-rc.d")
    own_policy = not policy.exists()
    if own_policy:
        policy.write_text("#!/bin/sh\n# tools: do not start services while installing\nexit 101\n")
        policy.chmod(0o755)
    try:
        yield
    finally:
        if own_policy:
            policy.unlink(missing_ok=True)


def ensure_packages() -> None:
    """apt-get install rabbitmq-server / postgresql when missing, without starting services.

    Runs ``apt-get update`` only when something must be installed. A temporary
    ``/usr/sbin/policy-rc.d`` (exit 101) stops the packages' maintainer scripts from starting
    their system services; if a system epmd/broker starts anyway, ours still uses its own node
    name and ports.
    """
    missing: list[str] = []
    if not RABBIT_SERVER.exists():
        missing.append("rabbitmq-server")
    if _pg_bin_dir() is None:
        missing.append("postgresql")
    if not missing:
        _log("packages present: rabbitmq-server, postgresql")
        return
    if os.geteuid() != 0:
        raise InfraError(f"missing packages {' '.join(missing)}: run as root (apt-get install)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with no_service_starts():
        _log("apt-get update")
        try:
            run(["apt-get", "update"], env=env, timeout=900)
        except InfraError as exc:
            _log(f"warning: apt-get update failed; trying the cached package lists ({exc})")
        _log(f"apt-get install -y {' '.join(missing)}")
        run(["apt-get", "install", "-y", *missing], env=env, timeout=1800)
    if not RABBIT_SERVER.exists() or _pg_bin_dir() is None:
        raise InfraError("packages installed but binaries not found")
    _log(f"installed {' '.join(missing)} (system services not started)")


# --------------------------------------------------------------------------- RabbitMQ


@dataclass
class RabbitNode:
    """A RabbitMQ node run from the Debian package's scripts, with all files under ``base``."""

    name: str
    base: Path
    port: int
    dist_port: int
    user: str
    password: str = field(repr=False)
    extra_conf: str = ""
    lift_consumer_timeout: bool = True
    # Erlang cookie; nodes meant to form a cluster need the same one. "" = generate once.
    cookie: str = field(default="", repr=False)
    start_timeout: float = 90.0
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False, compare=False)

    # ----- names and paths

    @property
    def node(self) -> str:
        return f"{self.name}@localhost"

    @property
    def pid_file(self) -> Path:
        return self.base / f"{self.name}.pid"

    @property
    def mnesia_base(self) -> Path:
        return self.base / "mnesia"

    @property
    def log_dir(self) -> Path:
        return self.base / "log"

    @property
    def console_log(self) -> Path:
        return self.log_dir / "console.log"

    @property
    def node_log(self) -> Path:
        return self.log_dir / f"{self.node}.log"

    @property
    def config_file(self) -> Path:
        return self.base / "rabbitmq.conf"

    @property
    def advanced_config_file(self) -> Path:
        return self.base / "advanced.config"

    @property
    def plugins_file(self) -> Path:
        return self.base / "enabled_plugins"

    @property
    def url(self) -> str:
        return f"amqp://{quote(self.user, safe='')}:{quote(self.password, safe='')}@{_LOOPBACK}:{self.port}/"

    def url_for(self, vhost: str) -> str:
        """AMQP URL for ``vhost`` (the default vhost "/" gives :attr:`url`)."""
        if vhost == "/":
            return self.url
        return self.url + quote(vhost, safe="")

    # ----- environment and files

    def _env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(self.base),
            LANG="C.UTF-8",
            LC_ALL="C.UTF-8",
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS=_LOOPBACK,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(self.mnesia_base),
            RABBITMQ_LOG_BASE=str(self.log_dir),
            RABBITMQ_CONFIG_FILE=str(self.config_file),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.advanced_config_file),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.plugins_file),
            RABBITMQ_PID_FILE=str(self.pid_file),
            # Skip /etc/rabbitmq/rabbitmq-env.conf: it could rename the node or move ports.
            RABBITMQ_CONF_ENV_FILE=str(self.base / "rabbitmq-env.conf"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=_ERL_LOOPBACK_ARGS,
            RABBITMQ_CTL_ERL_ARGS=_ERL_LOOPBACK_ARGS,
            ERL_EPMD_ADDRESS=_LOOPBACK,
            ERL_CRASH_DUMP=str(self.log_dir / "erl_crash.dump"),
        )
        return env

    def _write_files(self) -> None:
        for value, what in ((self.user, "user"), (self.password, "password")):
            if not _CONF_VALUE.fullmatch(value):
                raise InfraError(f"RabbitMQ {what} must match {_CONF_VALUE.pattern}")
        self.base.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.mnesia_base.mkdir(exist_ok=True)
        conf = [
            "# Written by tools/infra.py on every start; edit RabbitNode instead.",
            f"listeners.tcp.1 = {_LOOPBACK}:{self.port}",
            f"default_user = {self.user}",
            f"default_pass = {self.password}",
            "default_user_tags.administrator = true",
            "loopback_users = none",
            "log.file.level = info",
        ]
        if self.extra_conf.strip():
            conf += ["", "# extra_conf", self.extra_conf.strip()]
        _write_private(self.config_file, "\n".join(conf) + "\n")
        advanced = (
            "%% Written by tools/infra.py. The orchestrator holds deliveries unacked for the\n"
            "%% whole life of a job: lift the delivery acknowledgement timeout.\n"
            "[{rabbit, [{consumer_timeout, undefined}]}].\n"
            if self.lift_consumer_timeout
            else "%% Written by tools/infra.py (plain broker settings).\n[].\n"
        )
        _write_private(self.advanced_config_file, advanced)
        _write_private(self.plugins_file, "[].\n")
        _write_private(self.base / "rabbitmq-env.conf", "# Intentionally empty (tools/infra.py).\n")
        cookie = self.base / ".erlang.cookie"
        if self.cookie:
            if not cookie.exists() or cookie.read_text() != self.cookie:
                _write_private(cookie, self.cookie, 0o400)
        elif not cookie.exists():
            alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
            _write_private(cookie, "".join(secrets.choice(alphabet) for _ in range(20)), 0o400)

    # ----- process state

    def _pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def _live_pid(self) -> int | None:
        """PID of our beam process if alive (it must name our node on its command line)."""
        pid = self._pid()
        if pid is None or not _pid_alive(pid):
            return None
        if "beam" not in _cmdline(pid):
            return None
        # The broker's environment names its pid file (unique per node and base).
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return pid
        if f"RABBITMQ_PID_FILE={self.pid_file}".encode() not in environ:
            return None
        return pid

    def is_running(self) -> bool:
        """Our beam process is alive and accepts AMQP connections (cheap: no rabbitmqctl)."""
        return self._live_pid() is not None and _port_accepts(self.port)

    def _reap(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
            if self._proc.poll() is not None:
                self._proc = None

    # ----- rabbitmqctl

    def ctl(self, *args: str, timeout: float = 120.0) -> str:
        """Run ``rabbitmqctl -n NODE *args`` with this node's HOME/env; return stdout."""
        return run(
            [str(RABBITMQCTL), "-n", self.node, *args],
            env=self._env(),
            timeout=timeout,
            cwd=self.base if self.base.is_dir() else "/",
        )

    def add_vhost(self, vhost: str) -> None:
        """Create ``vhost`` (no error if it exists) and give ``user`` full permissions on it."""
        try:
            self.ctl("add_vhost", vhost)
        except InfraError as exc:
            if "already" not in str(exc) and "exists" not in str(exc):
                raise
        self.ctl("set_permissions", "-p", vhost, self.user, ".*", ".*", ".*")

    def delete_vhost(self, vhost: str) -> None:
        """Delete ``vhost`` with everything in it (no error if missing)."""
        try:
            self.ctl("delete_vhost", vhost)
        except InfraError as exc:
            if "not_found" not in str(exc) and "does not exist" not in str(exc):
                raise

    # ----- lifecycle

    def start(self) -> None:
        """Start the node, or reuse it if it is already running. Blocks until it is ready."""
        if self.is_running():
            _log(f"rabbitmq {self.node} already running on {_LOOPBACK}:{self.port} (reused)")
            return
        if not RABBIT_SERVER.exists():
            raise InfraError(f"{RABBIT_SERVER} missing: run tools.infra.ensure_packages()")
        began = time.monotonic()
        pid = self._live_pid()
        if pid is not None:
            _log(f"rabbitmq {self.node} (pid {pid}) is booting; waiting for it")
            try:
                self._wait_ready(pid)
            except InfraError:
                _log(f"rabbitmq {self.node} (pid {pid}) did not become ready; killing it")
                self.kill()
            else:
                self._ensure_user(fresh=False)
                return
        registered = epmd_names().get(self.name)
        if registered is not None:
            raise InfraError(
                f"rabbitmq: node name {self.name!r} is already registered with epmd "
                f"(distribution port {registered}) by another node; pick another name"
            )
        for port, what in ((self.port, "AMQP"), (self.dist_port, "distribution")):
            if not port_is_free(port):
                raise InfraError(f"rabbitmq {self.node}: {what} port {port} is in use")
        self._write_files()
        fresh = not (self.mnesia_base / self.node).exists()
        self.pid_file.unlink(missing_ok=True)
        with self.console_log.open("ab") as console:
            console.write(f"\n==== start {time.strftime('%Y-%m-%d %H:%M:%S')} ====\n".encode())
            console.flush()
            self._proc = subprocess.Popen(
                [str(RABBIT_SERVER)],
                env=self._env(),
                cwd=self.base,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_ready(None)
        except BaseException:
            with contextlib.suppress(Exception):
                self.kill()
            raise
        self._ensure_user(fresh=fresh)
        _log(f"rabbitmq {self.node} started on {_LOOPBACK}:{self.port} in {time.monotonic() - began:.1f}s")

    def _wait_ready(self, pid: int | None) -> None:
        """Wait (rabbitmqctl wait) for the boot to finish; fail fast if the server dies."""
        argv = [str(RABBITMQCTL), "-n", self.node, "wait", str(self.pid_file)]
        argv += ["--timeout", str(int(self.start_timeout))]
        if pid is not None:
            argv = [str(RABBITMQCTL), "-n", self.node, "wait", "--pid", str(pid)]
            argv += ["--timeout", str(int(self.start_timeout))]
        waiter = subprocess.Popen(
            argv,
            env=self._env(),
            cwd=self.base,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + self.start_timeout + 15
        failure: str | None = None
        while True:
            code = waiter.poll()
            if code is not None:
                output = waiter.stdout.read() if waiter.stdout else ""
                if code != 0:
                    failure = f"rabbitmqctl wait exited with {code}: {output.strip()}"
                break
            if self._proc is not None and self._proc.poll() is not None:
                failure = f"rabbitmq-server exited with {self._proc.returncode} while booting"
                break
            if time.monotonic() > deadline:
                failure = f"not ready after {self.start_timeout:.0f}s"
                break
            time.sleep(0.1)
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
        if waiter.stdout:
            waiter.stdout.close()
        if failure is None and not _port_accepts(self.port):
            failure = f"booted but nothing accepts connections on {_LOOPBACK}:{self.port}"
        if failure is not None:
            raise InfraError(
                f"rabbitmq {self.node}: {failure}\n--- {self.console_log}:\n"
                f"{_tail(self.console_log)}\n--- {self.node_log}:\n{_tail(self.node_log)}"
            )

    def _ensure_user(self, *, fresh: bool) -> None:
        """Make ``user``/``password`` valid even if the data predates the current password."""
        marker = self.base / ".credentials"
        digest = hashlib.sha256(f"{self.user}\0{self.password}".encode()).hexdigest()
        if not fresh and marker.exists() and marker.read_text().strip() == digest:
            return
        if not fresh:
            _log(f"rabbitmq {self.node}: (re)setting credentials of user {self.user}")
            try:
                self.ctl("add_user", self.user, self.password)
            except InfraError as exc:
                if "already" not in str(exc) and "exists" not in str(exc):
                    raise
                self.ctl("change_password", self.user, self.password)
            self.ctl("set_user_tags", self.user, "administrator")
            self.ctl("set_permissions", "-p", "/", self.user, ".*", ".*", ".*")
        _write_private(marker, digest + "\n")

    def stop(self) -> None:
        """Stop gracefully (``rabbitmqctl stop PIDFILE``); data stays. No error if not running."""
        pid = self._live_pid()
        if pid is None:
            self._reap()
            _log(f"rabbitmq {self.node} not running")
            return
        began = time.monotonic()
        try:
            self.ctl("stop", str(self.pid_file), timeout=150)
        except InfraError as exc:
            _log(f"rabbitmqctl stop failed ({exc}); sending SIGTERM to {pid}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if not _wait_gone([pid], 60):
            _log(f"rabbitmq {self.node} (pid {pid}) still alive after stop; SIGKILL")
            self.kill()
            return
        self._reap()
        _log(f"rabbitmq {self.node} stopped in {time.monotonic() - began:.1f}s")

    def kill(self) -> None:
        """SIGKILL the beam process (a crash: no clean shutdown). No error if not running."""
        if self._proc is not None and self._proc.poll() is None:
            # Started here and maybe still booting (no pid file yet): kill its process group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        pid = self._live_pid()
        if pid is None:
            self._reap()
            return
        children = _children(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        if not _wait_gone([pid, *children], 30):
            raise InfraError(f"rabbitmq {self.node} (pid {pid}) survived SIGKILL")
        self._reap()
        _log(f"rabbitmq {self.node} killed (pid {pid})")

    def destroy(self) -> None:
        """Kill the node and delete ``base`` with all its data."""
        self.kill()
        shutil.rmtree(self.base, ignore_errors=True)


# --------------------------------------------------------------------------- PostgreSQL


def _postgres_ids() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(PG_OS_USER)
    except KeyError as exc:
        raise InfraError(f"no '{PG_OS_USER}' OS user: install postgresql") from exc
    return entry.pw_uid, entry.pw_gid


def _pg_env() -> dict[str, str]:
    return {"PATH": _SYS_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _as_postgres(argv: Sequence[str]) -> list[str]:
    """Prefix ``argv`` so that it runs as the postgres OS user."""
    uid, _gid = _postgres_ids()
    if os.geteuid() == uid:
        return list(argv)
    if os.geteuid() != 0:
        raise InfraError(f"PostgreSQL must be run as root or {PG_OS_USER}")
    runuser = shutil.which("runuser", path=_SYS_PATH) or "/usr/sbin/runuser"
    return [runuser, "-u", PG_OS_USER, "--", *argv]


def _postgres_can_reach(path: Path) -> bool:
    """True if the postgres OS user can traverse ``path`` and every folder above it."""
    try:
        run(_as_postgres(["test", "-x", str(path)]), env=_pg_env(), timeout=30)
    except InfraError:
        return False
    return True


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
    password: str = field(default_factory=_new_password, repr=False)
    start_timeout: float = 60.0

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
            f"@{_LOOPBACK}:{self.port}/{quote(database, safe='')}"
        )

    # ----- setup

    def _fallback_root(self) -> Path:
        digest = hashlib.sha256(str(self.base.resolve()).encode()).hexdigest()[:10]
        return PG_FALLBACK_ROOT / f"orch-pg-{digest}"

    def _prepare(self) -> None:
        uid, gid = _postgres_ids()
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
            if short and _postgres_can_reach(self.base):
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
                _log(f"postgres: {reason}; data kept in {target} (symlink {link})")
        for sub, mode in (("data", 0o700), ("run", 0o755), ("log", 0o755)):
            path = self.root / sub
            if not path.exists():
                path.mkdir(mode=mode)
                os.chown(path, uid, gid)

    def _bin(self, program: str) -> str:
        bin_dir = _pg_bin_dir()
        if bin_dir is None:
            raise InfraError("PostgreSQL binaries missing: run tools.infra.ensure_packages()")
        return str(bin_dir / program)

    def _initdb(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        if any(self.data_dir.iterdir()):
            _log(f"postgres: removing incomplete cluster in {self.data_dir}")
            shutil.rmtree(self.data_dir)
            uid, gid = _postgres_ids()
            self.data_dir.mkdir(mode=0o700)
            os.chown(self.data_dir, uid, gid)
        _log(f"postgres: initdb {self.data_dir}")
        run(
            _as_postgres(
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
            conf.write("\n# tools/infra.py: port, addresses and socket folder\ninclude = 'orch.conf'\n")

    def _write_conf(self) -> None:
        uid, gid = _postgres_ids()
        conf = self.data_dir / "orch.conf"
        _write_private(
            conf,
            "# Written by tools/infra.py on every start.\n"
            f"listen_addresses = '{_LOOPBACK}'\n"
            f"port = {self.port}\n"
            f"unix_socket_directories = '{self.socket_dir}'\n",
        )
        os.chown(conf, uid, gid)

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
        if not _pid_alive(pid) or "postgres" not in _cmdline(pid):
            return None
        return pid, (lines[7].strip() if len(lines) > 7 else "")

    def is_running(self) -> bool:
        """The postmaster of this data folder is alive and reports ``ready``."""
        state = self._postmaster()
        return state is not None and state[1] == "ready"

    # ----- SQL

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` as the postgres superuser over the unix socket; return unaligned rows."""
        return run(
            _as_postgres(
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
            _log(f"postgres already running on {_LOOPBACK}:{self.port} (reused)")
            return
        began = time.monotonic()
        self._bin("postgres")
        self._prepare()
        state = self._postmaster()
        if state is not None:
            _log(f"postgres (pid {state[0]}) is {state[1] or 'busy'}; stopping it first")
            self.stop()
        if not port_is_free(self.port):
            raise InfraError(f"postgres: port {self.port} is in use")
        # After a crash the lock file names a dead (or zombie: PID 1 may not reap) process;
        # postgres itself only checks kill(pid, 0), which succeeds on a zombie.
        (self.data_dir / "postmaster.pid").unlink(missing_ok=True)
        self._initdb()
        self._write_conf()
        try:
            run(
                _as_postgres(
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
            raise InfraError(f"{exc}\n--- {self.log_file}:\n{_tail(self.log_file)}") from exc
        self._ensure_role()
        _log(f"postgres started on {_LOOPBACK}:{self.port} in {time.monotonic() - began:.1f}s")

    def stop(self) -> None:
        """``pg_ctl stop -m fast`` (clean shutdown, data stays). No error if not running."""
        state = self._postmaster()
        if state is None:
            _log("postgres not running")
            return
        began = time.monotonic()
        run(
            _as_postgres([self._bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "-s", "stop"]),
            env=_pg_env(),
            timeout=90,
        )
        _wait_gone([state[0]], 30)
        _log(f"postgres stopped in {time.monotonic() - began:.1f}s")

    def kill(self) -> None:
        """SIGKILL the postmaster and its children (a crash). No error if not running."""
        state = self._postmaster()
        if state is None:
            return
        pid = state[0]
        children = _children(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        if not _wait_gone([pid, *children], 30):
            raise InfraError(f"postgres (pid {pid}) survived SIGKILL")
        _log(f"postgres killed (pid {pid})")

    def destroy(self) -> None:
        """Kill the server and delete its data (including a /var/tmp target of ``<base>/pg``)."""
        self.kill()
        if self.pg_link.is_symlink():
            shutil.rmtree(self.pg_link.resolve(), ignore_errors=True)
            self.pg_link.unlink()
        shutil.rmtree(self.base, ignore_errors=True)


# --------------------------------------------------------------------------- state / CLI


def _resolve_base(base: Path | None) -> Path:
    if base is None:
        base = Path(os.environ.get(BASE_ENV_VAR) or DEFAULT_BASE)
    return base.absolute()


def _load_state(base: Path) -> dict[str, dict[str, Any]]:
    try:
        raw: object = json.loads((base / "infra.json").read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InfraError(f"cannot read {base / 'infra.json'}: {exc}") from exc
    if not isinstance(raw, dict):
        raise InfraError(f"{base / 'infra.json'} is not a JSON object")
    return {str(k): v for k, v in raw.items() if isinstance(v, dict)}


def _save_state(base: Path, state: Mapping[str, Mapping[str, Any]]) -> None:
    _write_private(base / "infra.json", json.dumps(state, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def _locked(base: Path) -> Iterator[None]:
    base.mkdir(parents=True, exist_ok=True)
    with (base / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _int(section: Mapping[str, Any], key: str, default: int) -> int:
    value = section.get(key, default)
    return value if isinstance(value, int) else default


def _str(section: Mapping[str, Any], key: str, default: str) -> str:
    value = section.get(key)
    return value if isinstance(value, str) and value else default


def _nodes(base: Path, *, allocate: bool) -> tuple[RabbitNode, PostgresNode]:
    """Nodes described by ``<base>/infra.json``; with ``allocate``, fix ports and save."""
    state = _load_state(base)
    rabbit_state = state.get("rabbitmq", {})
    pg_state = state.get("postgres", {})
    # Erlang node names are machine-wide (epmd): one per base folder.
    default_name = "orch-" + hashlib.sha256(str(base).encode()).hexdigest()[:6]
    rabbit = RabbitNode(
        name=_str(rabbit_state, "name", default_name),
        base=base / "rabbitmq",
        port=_int(rabbit_state, "port", DEFAULT_AMQP_PORT),
        dist_port=_int(rabbit_state, "dist_port", DEFAULT_DIST_PORT),
        user=_str(rabbit_state, "user", DEFAULT_USER),
        password=_str(rabbit_state, "password", "") or _new_password(),
    )
    pg = PostgresNode(
        base=base / "postgres",
        port=_int(pg_state, "port", DEFAULT_PG_PORT),
        user=_str(pg_state, "user", DEFAULT_USER),
        password=_str(pg_state, "password", "") or _new_password(),
    )
    if not allocate:
        return rabbit, pg
    taken: set[int] = set()
    if rabbit.is_running():
        taken |= {rabbit.port, rabbit.dist_port}
    if pg.is_running():
        taken.add(pg.port)
    else:
        pg.port = _move(pg.port, taken, "postgres")
        taken.add(pg.port)
    if not rabbit.is_running():
        rabbit.port = _move(rabbit.port, taken, "rabbitmq AMQP")
        taken.add(rabbit.port)
        rabbit.dist_port = _move(rabbit.dist_port, taken, "rabbitmq distribution")
    new_state = {
        "rabbitmq": {
            "name": rabbit.name,
            "port": rabbit.port,
            "dist_port": rabbit.dist_port,
            "user": rabbit.user,
            "password": rabbit.password,
        },
        "postgres": {"port": pg.port, "user": pg.user, "password": pg.password},
    }
    if new_state != state:
        _save_state(base, new_state)
    return rabbit, pg


def _move(port: int, taken: set[int], what: str) -> int:
    chosen = _pick_port(port, taken)
    if chosen != port:
        _log(f"{what} port {port} is busy (not ours); using {chosen}")
    return chosen


def rabbit_node(base: Path | None = None) -> RabbitNode:
    """The project's RabbitMQ node under ``base`` (ports/password from ``infra.json``)."""
    base = _resolve_base(base)
    with _locked(base):
        return _nodes(base, allocate=True)[0]


def postgres_node(base: Path | None = None) -> PostgresNode:
    """The project's PostgreSQL node under ``base`` (port/password from ``infra.json``)."""
    base = _resolve_base(base)
    with _locked(base):
        return _nodes(base, allocate=True)[1]


def env_lines(rabbit: RabbitNode, pg: PostgresNode, database: str = "orch") -> list[str]:
    return [
        f"ORCH_AMQP_URL={shlex.quote(rabbit.url)}",
        f"ORCH_DATABASE_URL={shlex.quote(pg.url(database))}",
    ]


def up(base: Path | None = None, *, install: bool = True) -> dict[str, str]:
    """Start (or reuse) both servers, create database ``orch``, write ``<base>/env``."""
    base = _resolve_base(base)
    began = time.monotonic()
    if install:
        ensure_packages()
    with _locked(base):
        rabbit, pg = _nodes(base, allocate=True)
        # RabbitMQ boots in several seconds: start PostgreSQL meanwhile.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rabbitmq-start") as pool:
            rabbit_started = pool.submit(rabbit.start)
            pg.start()
            pg.create_database("orch")
            rabbit_started.result()
        lines = env_lines(rabbit, pg)
        _write_private(base / "env", "\n".join(lines) + "\n")
    _log(f"up in {time.monotonic() - began:.1f}s; env written to {base / 'env'}")
    return dict(line.split("=", 1) for line in lines)


def down(base: Path | None = None) -> None:
    """Stop both servers gracefully (data stays)."""
    base = _resolve_base(base)
    if not (base / "infra.json").exists():
        _log(f"nothing to stop: no {base / 'infra.json'}")
        return
    with _locked(base):
        rabbit, pg = _nodes(base, allocate=False)
        rabbit.stop()
        pg.stop()


def destroy(base: Path | None = None) -> None:
    """Kill both servers and delete ``base`` (all data, ports, passwords)."""
    base = _resolve_base(base)
    if (base / "infra.json").exists():
        with _locked(base):
            rabbit, pg = _nodes(base, allocate=False)
            rabbit.destroy()
            pg.destroy()
    shutil.rmtree(base, ignore_errors=True)
    _log(f"removed {base}")


def status(base: Path | None = None, out: TextIO | None = None) -> dict[str, bool]:
    """Print and return whether each server runs."""
    base = _resolve_base(base)
    out = out or sys.stdout
    if not (base / "infra.json").exists():
        print(f"rabbitmq: not running\npostgres: not running\n(no {base / 'infra.json'})", file=out)
        return {"rabbitmq": False, "postgres": False}
    rabbit, pg = _nodes(base, allocate=False)
    result = {"rabbitmq": rabbit.is_running(), "postgres": pg.is_running()}
    print(
        f"rabbitmq: {'running' if result['rabbitmq'] else 'not running'}"
        f" (node {rabbit.node}, amqp {_LOOPBACK}:{rabbit.port}, base {rabbit.base})",
        file=out,
    )
    print(
        f"postgres: {'running' if result['postgres'] else 'not running'} ({_LOOPBACK}:{pg.port}, base {pg.base})",
        file=out,
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.infra",
        description="Local RabbitMQ + PostgreSQL for development, tests and CI.",
    )
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        help=f"state folder (default: ${BASE_ENV_VAR} or {DEFAULT_BASE})",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("up", help="install if missing, start both, write and print <base>/env")
    commands.add_parser("down", help="stop both (data stays)")
    commands.add_parser("status", help="print whether each runs (exit 3 unless both run)")
    commands.add_parser("env", help="print <base>/env")
    commands.add_parser("destroy", help="stop both and delete all their data")
    args = parser.parse_args(argv)
    base = _resolve_base(args.base)
    try:
        if args.command == "up":
            for key, value in up(base).items():
                print(f"{key}={value}")
        elif args.command == "down":
            down(base)
        elif args.command == "status":
            return 0 if all(status(base).values()) else 3
        elif args.command == "env":
            env_file = base / "env"
            if not env_file.exists():
                print(f"no {env_file}: run `python -m tools.infra up` first", file=sys.stderr)
                return 1
            sys.stdout.write(env_file.read_text())
        elif args.command == "destroy":
            destroy(base)
    except InfraError as exc:
        print(f"[infra] error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
