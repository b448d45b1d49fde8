"""A RabbitMQ node run from the Debian package's scripts as a plain process, every file under
one folder: config, pid file, Erlang cookie, mnesia data and logs. Several nodes (other names
and ports) may run side by side, e.g. brokers of their own in tests.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from tools.infra import conflicts
from tools.infra.brokers import Install, default_install
from tools.infra.state import REPO
from tools.infra.system import (
    LOOPBACK,
    InfraError,
    cmdline,
    kill_tree,
    log,
    pid_alive,
    port_accepts,
    port_is_free,
    run,
    tail,
    wait_gone,
    wait_until,
    write_private,
)
from tools.infra.tls import TlsFiles

# Distribution (node to node, rabbitmqctl) on loopback only, like AMQP.
_ERL_LOOPBACK_ARGS = "-kernel inet_dist_use_interface {127,0,0,1}"
# How long a killed node's name may stay registered with epmd (``RabbitNode._epmd_forgets``).
_EPMD_FORGETS_S = 10.0
# The orchestrator's broker settings, the files compose ships, copied as they are, so what
# `make run`, the tests and the benches run is what users get. Each file says why each
# setting is there: the consumer timeout lifted (every series), deprecated features denied
# (4.x: 3.10 knows no such keys), channels woken every 10 minutes.
SHIPPED = REPO / "deploy" / "rabbitmq"
SHIPPED_CONF = SHIPPED / "orchestrator.conf"
SHIPPED_DENY_DEPRECATED = SHIPPED / "deny-deprecated.conf"
SHIPPED_ADVANCED_CONFIG = SHIPPED / "advanced.config"
# Characters allowed in user names and passwords written into rabbitmq.conf.
_CONF_VALUE = re.compile(r"[A-Za-z0-9._~!$&*+,;=:@%^()\[\]{}|/?<>-]+")


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
    # False: RabbitMQ's own defaults (a 30-minute consumer timeout, checked every minute).
    product_settings: bool = True
    # advanced.config's text instead of the one product_settings picks.
    advanced_config: str | None = None
    # Erlang cookie; nodes meant to form a cluster need the same one. "" = generate once.
    cookie: str = field(default="", repr=False)
    start_timeout: float = 90.0
    # Which RabbitMQ and where its binaries are (``brokers``): the selected series by default.
    install: Install = field(default_factory=default_install)
    # A loopback address this node's outgoing distribution connections come from ("": any). A
    # cluster gives each member its own, so that ``partition`` can cut one member's traffic to
    # the others by address while rabbitmqctl (from 127.0.0.1) still reaches every node.
    dist_source: str = ""
    # With ``tls``, a second listener on ``tls_port`` speaks TLS only, and asks every client
    # for a certificate signed by ``tls.ca`` (mutual TLS); the plain one stays.
    tls: TlsFiles | None = None
    tls_port: int = 0
    # With a port, RabbitMQ's own Prometheus endpoint (the rabbitmq_prometheus plugin) serves
    # ``metrics_url`` there, where a service on a cluster reads the node's net_ticktime.
    prometheus_port: int = 0
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
        return f"amqp://{quote(self.user, safe='')}:{quote(self.password, safe='')}@{LOOPBACK}:{self.port}/"

    @property
    def metrics_url(self) -> str:
        """Its Prometheus endpoint (with ``prometheus_port``)."""
        return f"http://{LOOPBACK}:{self.prometheus_port}/metrics"

    def tls_url_for(self, vhost: str, host: str = LOOPBACK) -> str:
        """The ``amqps://`` URL of ``vhost`` on the TLS listener, reached as ``host``."""
        path = "" if vhost == "/" else quote(vhost, safe="")
        return f"amqps://{quote(self.user, safe='')}:{quote(self.password, safe='')}@{host}:{self.tls_port}/{path}"

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
            RABBITMQ_NODE_IP_ADDRESS=LOOPBACK,
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
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=_ERL_LOOPBACK_ARGS + self._dist_source_args(),
            RABBITMQ_CTL_ERL_ARGS=_ERL_LOOPBACK_ARGS,
            ERL_EPMD_ADDRESS=LOOPBACK,
            ERL_CRASH_DUMP=str(self.log_dir / "erl_crash.dump"),
        )
        return env

    def _dist_source_args(self) -> str:
        """The VM flag that makes outgoing distribution connections come from ``dist_source``
        (not given to rabbitmqctl: its connections must come from 127.0.0.1)."""
        if not self.dist_source:
            return ""
        return f" -kernel inet_dist_connect_options [{{ip,{{{self.dist_source.replace('.', ',')}}}}}]"

    def started_with_dist_source(self) -> bool:
        """Whether the running node was started with its ``dist_source`` (a node started by an
        older checkout was not, and ``partition`` cannot cut it)."""
        pid = self._live_pid()
        if pid is None or not self.dist_source:
            return False
        return self._dist_source_args().strip().split()[-1] in cmdline(pid)

    def _advanced_config(self) -> str:
        if self.advanced_config is not None:
            return self.advanced_config
        if not self.product_settings:
            return "%% Written by tools/infra/rabbitmq.py (plain broker settings).\n[].\n"
        return SHIPPED_ADVANCED_CONFIG.read_text()

    def _write_files(self) -> None:
        for value, what in ((self.user, "user"), (self.password, "password")):
            if not _CONF_VALUE.fullmatch(value):
                raise InfraError(f"RabbitMQ {what} must match {_CONF_VALUE.pattern}")
        self.base.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self.mnesia_base.mkdir(exist_ok=True)
        conf = [
            "# Written by tools/infra/rabbitmq.py on every start; edit RabbitNode instead.",
            f"listeners.tcp.1 = {LOOPBACK}:{self.port}",
            f"default_user = {self.user}",
            f"default_pass = {self.password}",
            "default_user_tags.administrator = true",
            "loopback_users = none",
            "log.file.level = info",
        ]
        if self.product_settings:
            conf += ["", f"# {SHIPPED_CONF.name}", SHIPPED_CONF.read_text().strip()]
            if self.install.series != "3.10":
                conf += ["", f"# {SHIPPED_DENY_DEPRECATED.name}", SHIPPED_DENY_DEPRECATED.read_text().strip()]
        if self.tls is not None:
            files = self.tls.copy_to(self.base / "tls")  # the node's folder is what its root sees
            conf += [
                "",
                "# tls (RabbitNode.tls): a TLS listener that asks each client for a certificate",
                f"listeners.ssl.default = {LOOPBACK}:{self.tls_port}",
                f"ssl_options.cacertfile = {files.ca}",
                f"ssl_options.certfile = {files.cert}",
                f"ssl_options.keyfile = {files.key}",
                "ssl_options.verify = verify_peer",
                "ssl_options.fail_if_no_peer_cert = true",
            ]
        if self.prometheus_port:
            conf += ["", f"prometheus.tcp.ip = {LOOPBACK}", f"prometheus.tcp.port = {self.prometheus_port}"]
        if self.extra_conf.strip():
            conf += ["", "# extra_conf", self.extra_conf.strip()]
        write_private(self.config_file, "\n".join(conf) + "\n")
        write_private(self.advanced_config_file, self._advanced_config())
        write_private(self.plugins_file, "[rabbitmq_prometheus].\n" if self.prometheus_port else "[].\n")
        write_private(self.base / "rabbitmq-env.conf", "# Intentionally empty (tools/infra/rabbitmq.py).\n")
        cookie = self.base / ".erlang.cookie"
        if self.cookie:
            if not cookie.exists() or cookie.read_text() != self.cookie:
                write_private(cookie, self.cookie, 0o400)
        elif not cookie.exists():
            alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
            write_private(cookie, "".join(secrets.choice(alphabet) for _ in range(20)), 0o400)

    # ----- process state

    def _pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def _live_pid(self) -> int | None:
        """PID of our beam process if alive (it must name our node on its command line)."""
        pid = self._pid()
        if pid is None or not pid_alive(pid):
            return None
        if "beam" not in cmdline(pid):
            return None
        # The broker's environment names its pid file (unique per node and base).
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return pid
        if f"RABBITMQ_PID_FILE={self.pid_file}".encode() not in environ:
            return None
        return pid

    def live_pid(self) -> int | None:
        """The pid of this node's broker (the Erlang VM), if it runs."""
        return self._live_pid()

    def is_running(self) -> bool:
        """Our beam process is alive and accepts AMQP connections (cheap: no rabbitmqctl)."""
        return self._live_pid() is not None and port_accepts(self.port)

    def _reap(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
            if self._proc.poll() is not None:
                self._proc = None

    def _command(self, *argv: str) -> list[str]:
        """``argv`` run with this node's RabbitMQ: inside its root, if it has one, with the
        node's folder at the same path."""
        self.base.mkdir(parents=True, exist_ok=True)
        return self.install.command(argv, [self.base])

    # ----- rabbitmqctl

    def ctl(self, *args: str, timeout: float = 120.0) -> str:
        """Run ``rabbitmqctl -n NODE *args`` with this node's HOME/env; return stdout."""
        return run(
            self._command(str(self.install.ctl), "-n", self.node, *args),
            env=self._env(),
            timeout=timeout,
            cwd=self.base if self.base.is_dir() else "/",
        )

    def add_vhost(self, vhost: str) -> None:
        """Create ``vhost`` (no error if it exists) and give ``user`` full permissions on it."""
        self.add_vhosts([vhost])

    def delete_vhost(self, vhost: str, timeout: float = 120.0) -> None:
        """Delete ``vhost`` with everything in it (no error if missing). Slow with many
        persistent messages in it: 300,000 took RabbitMQ 3.10 over two minutes."""
        self.delete_vhosts([vhost], timeout)

    def add_vhosts(self, vhosts: Sequence[str]) -> None:
        """``add_vhost`` for each of ``vhosts`` in one call: each rabbitmqctl call boots an
        Erlang VM (about a CPU second on this machine), and the test suite made three per
        test (add, permissions, delete)."""
        self._each_vhost(
            f"""
            ok = case rabbit_vhost:exists(V) of
                true -> ok;
                false -> rabbit_vhost:add(V, {_ACTING_USER})
            end,
            ok = rabbit_auth_backend_internal:set_permissions(
                {_binary(self.user)}, V, <<".*">>, <<".*">>, <<".*">>, {_ACTING_USER})
            """,
            vhosts,
        )

    def delete_vhosts(self, vhosts: Sequence[str], timeout: float = 120.0) -> None:
        """``delete_vhost`` for each of ``vhosts`` (those that exist) in one call."""
        self._each_vhost(
            f"""
            ok = case rabbit_vhost:exists(V) of
                true -> rabbit_vhost:delete(V, {_ACTING_USER});
                false -> ok
            end
            """,
            vhosts,
            timeout,
        )

    def _each_vhost(self, body: str, vhosts: Sequence[str], timeout: float = 120.0) -> None:
        """Run the Erlang ``body`` with ``V`` bound to each of ``vhosts``, in one
        ``rabbitmqctl eval`` (the functions the CLI's own vhost commands call); a body that
        does not match ``ok`` fails the call."""
        self.ctl("eval", f"lists:foreach(fun(V) -> {body} end, {_binaries(vhosts)}).", timeout=timeout)

    # ----- lifecycle

    def start(self) -> None:
        """Start the node, or reuse it if it is already running. Blocks until it is ready."""
        if self.is_running():
            log(f"rabbitmq {self.node} already running on {LOOPBACK}:{self.port} (reused)")
            with contextlib.suppress(OSError):
                if self.advanced_config_file.read_text() != self._advanced_config():
                    # A checkout updated under a running broker: say so, do not restart it
                    # under whatever is using it.
                    log(
                        f"rabbitmq {self.node} was started with other settings than this checkout's "
                        f"{self.advanced_config_file.name}: `python -m tools.infra down`, then `up`, applies them"
                    )
            return
        if not self.install.present():
            raise InfraError(
                f"RabbitMQ {self.install.series} is not installed ({self.install.root or 'host'}): "
                "run `python -m tools.infra up` first"
            )
        began = time.monotonic()
        pid = self._live_pid()
        if pid is not None:
            log(f"rabbitmq {self.node} (pid {pid}) is booting; waiting for it")
            try:
                self._wait_ready(pid)
            except InfraError:
                log(f"rabbitmq {self.node} (pid {pid}) did not become ready; killing it")
                self.kill()
            else:
                self._ensure_user(fresh=False)
                return
        self._check_nothing_in_the_way()
        self._write_files()
        fresh = not (self.mnesia_base / self.node).exists()
        self.pid_file.unlink(missing_ok=True)
        with self.console_log.open("ab") as console:
            console.write(f"\n==== start {time.strftime('%Y-%m-%d %H:%M:%S')} ====\n".encode())
            console.flush()
            self._proc = subprocess.Popen(
                self._command(str(self.install.server)),
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
        log(f"rabbitmq {self.node} started on {LOOPBACK}:{self.port} in {time.monotonic() - began:.1f}s")

    def _check_nothing_in_the_way(self) -> None:
        """Fail fast, naming the process and how to stop it, when our node name or a port is
        held by a process our pid file does not name. A node left running by a checkout
        deleted at this same path is one: it has the same derived name, and nothing here
        knows it any more."""
        registered = conflicts.epmd_names().get(self.name)
        if registered is not None and not port_is_free(registered):
            found = conflicts.listening_holder(registered)
            raise InfraError(conflicts.node_name_taken(self.name, registered, self.pid_file, found))
        if registered is not None and not self._epmd_forgets(_EPMD_FORGETS_S):
            # Registered, yet nobody listens on its distribution port: not a node that runs.
            raise InfraError(conflicts.node_name_taken(self.name, registered, self.pid_file, None))
        for port, what in ((self.port, "AMQP"), (self.dist_port, "distribution"), (self.prometheus_port, "Prometheus")):
            if port and not port_is_free(port):
                found = conflicts.listening_holder(port)
                label = f"rabbitmq {self.node}: {what} port"
                raise InfraError(conflicts.port_taken(label, port, found, self.pid_file))

    def _epmd_forgets(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for epmd to drop this node's name; whether it did. A node
        stays registered as long as its connection to epmd is open, and epmd notices a killed
        node's closed connection only when it next runs: a test's power cut (``kill``, then
        ``start`` at once) found the name still there on a busy machine, and the start
        refused a node that no longer existed."""
        return wait_until(lambda: self.name not in conflicts.epmd_names(), timeout)

    def _wait_ready(self, pid: int | None) -> None:
        """Wait (rabbitmqctl wait) for the boot to finish; fail fast if the server dies."""
        which = ["--pid", str(pid)] if pid is not None else [str(self.pid_file)]
        argv = [str(self.install.ctl), "-n", self.node, "wait", *which, "--timeout", str(int(self.start_timeout))]
        waiter = subprocess.Popen(
            self._command(*argv),
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
        if failure is None and not port_accepts(self.port):
            failure = f"booted but nothing accepts connections on {LOOPBACK}:{self.port}"
        if failure is not None:
            raise InfraError(
                f"rabbitmq {self.node}: {failure}\n--- {self.console_log}:\n"
                f"{tail(self.console_log)}\n--- {self.node_log}:\n{tail(self.node_log)}"
            )

    def _ensure_user(self, *, fresh: bool) -> None:
        """Make ``user``/``password`` valid even if the data predates the current password."""
        marker = self.base / ".credentials"
        digest = hashlib.sha256(f"{self.user}\0{self.password}".encode()).hexdigest()
        if not fresh and marker.exists() and marker.read_text().strip() == digest:
            return
        if not fresh:
            log(f"rabbitmq {self.node}: (re)setting credentials of user {self.user}")
            try:
                self.ctl("add_user", self.user, self.password)
            except InfraError as exc:
                if "already" not in str(exc) and "exists" not in str(exc):
                    raise
                self.ctl("change_password", self.user, self.password)
            self.ctl("set_user_tags", self.user, "administrator")
            self.ctl("set_permissions", "-p", "/", self.user, ".*", ".*", ".*")
        write_private(marker, digest + "\n")

    def stop(self) -> None:
        """Stop gracefully (``rabbitmqctl stop PIDFILE``); data stays. No error if not running."""
        pid = self._live_pid()
        if pid is None:
            self._reap()
            log(f"rabbitmq {self.node} not running")
            return
        began = time.monotonic()
        try:
            self.ctl("stop", str(self.pid_file), timeout=150)
        except InfraError as exc:
            log(f"rabbitmqctl stop failed ({exc}); sending SIGTERM to {pid}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if not wait_gone([pid], 60):
            log(f"rabbitmq {self.node} (pid {pid}) still alive after stop; SIGKILL")
            self.kill()
            return
        self._reap()
        log(f"rabbitmq {self.node} stopped in {time.monotonic() - began:.1f}s")

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
        kill_tree(pid, f"rabbitmq {self.node}")
        self._reap()
        self._epmd_forgets(_EPMD_FORGETS_S)  # so that a start right after finds its name free
        log(f"rabbitmq {self.node} killed (pid {pid})")

    def destroy(self) -> None:
        """Kill the node and delete ``base`` with all its data."""
        self.kill()
        shutil.rmtree(self.base, ignore_errors=True)


_ACTING_USER = '<<"orch-infra">>'
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


def _binary(text: str) -> str:
    """An Erlang binary literal of ``text``, which must be a plain name (no quoting needed)."""
    if not _SAFE_NAME.match(text):
        raise InfraError(f"not a plain name for rabbitmqctl eval: {text!r}")
    return f'<<"{text}">>'


def _binaries(texts: Sequence[str]) -> str:
    return "[" + ", ".join(_binary(t) for t in texts) + "]"
