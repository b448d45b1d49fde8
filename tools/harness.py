"""Real processes for the integration tests and the benchmark: a manager and observer
services on a real RabbitMQ vhost and a real PostgreSQL database, both private to one test
or one bench run. Owned here, under tools/, because both tests/ and bench/ use it and
nothing outside tests/ should import tests/ (issue 15)."""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aio_pika
import httpx

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")

# Fast clocks so failure scenarios finish in seconds (the defaults suit production).
FAST_ENV = {
    "ORCH_HEARTBEAT_S": "1",
    "ORCH_AMQP_HEARTBEAT_S": "2",
    "ORCH_LOST_AFTER_HEARTBEATS": "3",
    "ORCH_RESTOP_AFTER_S": "2",
    "ORCH_INVENTORY_S": "3",
    "ORCH_UNKNOWN_GRACE_S": "2",
    "ORCH_STOP_GRACE_S": "2",
    "ORCH_PENDING_START_AFTER_S": "5",
    "ORCH_REPAIR_INTERVAL_S": "0.5",
    "ORCH_LOG_LEVEL": "INFO",
    # Observers stay where the broker put them unless a test turns the balancer on
    # (tests/system/test_balance.py): most tests place them on purpose.
    "ORCH_BALANCE_MOVES_PER_S": "0",
}


_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_given_ports: set[int] = set()


def free_port() -> int:
    """A loopback port nobody listens on now, for a server a test starts later: chosen outside
    the kernel's ephemeral range, never handed out twice by this process. A port from
    bind(0) is back in that range once the picker closes it, and any process's next bind(0)
    may take it before the server binds it: a manager's state process once took the port a
    test had picked for the manager. Outside the range only explicit binds take a port."""
    try:
        low, high = (int(n) for n in _EPHEMERAL.read_text().split()[:2])
    except (OSError, ValueError):
        low, high = 32768, 60999
    # Below the range, or above it where it starts too low to leave room (1024-60999 is set
    # on some hosts).
    first, last = (10_000, low) if low > 11_000 else (high + 1, 65_536)
    if last - first < 1000:  # the whole range is ephemeral: bind(0) is all there is
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    for _ in range(1000):
        port = random.randrange(first, last)
        if port in _given_ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given_ports.add(port)
        return port
    raise RuntimeError(f"no free loopback port found from {first} to {last - 1}")


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, what: str = "condition", every: float = 0.2) -> T:
    """Poll until ``predicate()`` is truthy; return its value. Generous timeouts only."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (httpx.HTTPError, OSError) as e:
            last_error = e
        time.sleep(every)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what}" + (f" ({last_error!r})" if last_error else "")
    )


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(10)

    def terminate(self, timeout: float = 30.0) -> int:
        self.signal(signal.SIGTERM)
        return self.popen.wait(timeout)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def state_process(self) -> int | None:
        """The pid of a manager's state process (its child running manager.state_side): a
        signal to the manager's own pid reaches only its API."""
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                ppid = int((proc / "stat").read_text().rpartition(")")[2].split()[1])
                cmdline = (proc / "cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if ppid == self.popen.pid and b"manager.state_side" in cmdline:
                return int(proc.name)
        return None


@dataclass
class System:
    amqp_url: str
    database_url: str
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    manager_port: int = field(default_factory=free_port)
    procs: list[Proc] = field(default_factory=list)
    manager: Proc | None = None
    # Sent as a bearer token by the HTTP helpers (a manager started with ORCH_API_TOKENS).
    token: str | None = None
    # The CA of a manager that serves HTTPS (ORCH_MANAGER_TLS_CERT_FILE): the helpers verify it.
    https_ca: Path | None = None

    # --- processes -----------------------------------------------------------------------

    def _spawn(self, name: str, module: str, extra: dict[str, str]) -> Proc:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
        env |= FAST_ENV | {"ORCH_AMQP_URL": self.amqp_url, "ORCH_DATABASE_URL": self.database_url}
        env |= self.env | extra
        log = self.workdir / f"{name}.{len(self.procs)}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", module], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def start_manager(self, wait: bool = True, **extra: str) -> Proc:
        self.manager = self._spawn("manager", "manager", {"ORCH_MANAGER_PORT": str(self.manager_port)} | extra)
        if wait:
            wait_for(lambda: self.get("/readyz").status_code == 200, 60, "the manager to be ready")
        return self.manager

    def start_process(self, name: str, module: str, **extra: str) -> Proc:
        """Any of the project's processes (``python -m module``) with this system's settings,
        not waited for: e.g. the manager's state process alone."""
        return self._spawn(name, module, extra)

    def start_service(self, name: str, workers: int = 10, wait: bool = True, **extra: str) -> Proc:
        proc = self._spawn(
            name, "observer_service", {"ORCH_SERVICE_NAME": name, "ORCH_WORKERS_COUNT": str(workers)} | extra
        )
        if wait and self.manager is not None and self.manager.alive():
            wait_for(lambda: self.service_by_name(name, pid=proc.popen.pid), 60, f"service {name} to be alive")
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.alive():
                proc.signal(signal.SIGKILL)
                proc.popen.wait(10)

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} ({p.log.name}) =====\n{p.text()[-6000:]}" for p in self.procs)

    # --- HTTP ----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"{'https' if self.https_ca else 'http'}://127.0.0.1:{self.manager_port}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _verify(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cafile=str(self.https_ca)) if self.https_ca else True

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(self.base_url + path, params=params, headers=self.headers(), timeout=10, verify=self._verify())

    def post(self, path: str, json: Any) -> httpx.Response:
        return httpx.post(self.base_url + path, json=json, headers=self.headers(), timeout=10, verify=self._verify())

    def delete(self, path: str) -> httpx.Response:
        return httpx.delete(self.base_url + path, headers=self.headers(), timeout=10, verify=self._verify())

    def create(
        self, name: str, kind: str = "ticker", args: dict[str, Any] | None = None, **extra: Any
    ) -> dict[str, Any]:
        response = self.post("/api/observers", {"name": name, "kind": kind, "args": args or {}} | extra)
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        return body

    def observer(self, observer_id: str) -> dict[str, Any]:
        response = self.get(f"/api/observers/{observer_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def observers(self, **filters: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor = None
        while True:
            page = self.get("/api/observers", limit=1000, **filters, **({"cursor": cursor} if cursor else {})).json()
            items += page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                return items

    def services(self) -> list[dict[str, Any]]:
        body: list[dict[str, Any]] = self.get("/api/services").json()
        return body

    def service_by_name(self, name: str, pid: int | None = None, status: str = "alive") -> dict[str, Any] | None:
        for svc in self.services():
            if svc["name"] == name and svc["status"] == status and (pid is None or svc["pid"] == pid):
                return svc
        return None

    def wait_status(self, observer_id: str, status: str, timeout: float = 30.0) -> dict[str, Any]:
        return wait_for(
            lambda: (o := self.observer(observer_id))["status"] == status and o,
            timeout,
            f"observer {observer_id} to be {status}",
        )

    # --- AMQP ----------------------------------------------------------------------------

    def amqp(self, fn: Callable[[aio_pika.abc.AbstractChannel], Awaitable[T]]) -> T:
        async def run() -> T:
            connection = await aio_pika.connect(self.amqp_url)
            try:
                channel = await connection.channel()
                return await fn(channel)
            finally:
                await connection.close()

        return asyncio.run(run())

    def queue_counts(self, queue: str) -> tuple[int, int]:
        """(ready messages, consumers) of a queue, by a passive declare."""

        async def count(channel: aio_pika.abc.AbstractChannel) -> tuple[int, int]:
            q = await channel.declare_queue(queue, passive=True)
            result = q.declaration_result
            return int(result.message_count or 0), int(result.consumer_count or 0)

        return self.amqp(count)

    def publish_raw(self, routing_key: str, body: bytes, exchange: str = "") -> None:
        async def publish(channel: aio_pika.abc.AbstractChannel) -> None:
            target = channel.default_exchange if not exchange else await channel.get_exchange(exchange)
            await target.publish(aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key)

        self.amqp(publish)


def probe_args(log: Path, interval_s: float = 0.2, **more: Any) -> dict[str, Any]:
    """Args of the test plug-in's ``probe`` kind (the ``with_test_plugin`` fixture installs it):
    a ticker that appends a line per tick to ``log``, read back by ``read_ticks``."""
    return {"interval_s": interval_s, "log_file": str(log)} | more


def metric(system: System, name: str) -> float:
    """A sample of the manager's ``/metrics`` (0 if it was never counted or set)."""
    found = re.search(rf"^{name} (\S+)$", system.get("/metrics").text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def read_ticks(path: Path) -> list[tuple[str, str, int, float]]:
    """Lines a ``probe`` wrote: (observer id, service id, pid, unix time)."""
    return [(observer, service, pid, at) for observer, service, pid, at, _ in read_probe_lines(path)]


def read_probe_lines(path: Path) -> list[tuple[str, str, int, float, str]]:
    """Lines the test plug-in wrote: (observer id, service id, pid, unix time, run token);
    the token is ``probe``'s, one per start of the observer on a service ("" for other kinds)."""
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) in (4, 5):
            run = parts[4] if len(parts) == 5 else ""
            lines.append((parts[0], parts[1], int(parts[2]), float(parts[3]), run))
    return lines


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"
