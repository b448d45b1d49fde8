"""What both servers run on: commands, processes, loopback ports and private files.

Standard library only (like the whole package): ``python3 -m tools.infra`` runs with the
system Python before the project's virtualenv exists.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

LOOPBACK = "127.0.0.1"

_print_lock = threading.Lock()


class InfraError(RuntimeError):
    """A server could not be installed, started, stopped or queried."""


def log(message: str) -> None:
    # RabbitMQ starts in a thread while PostgreSQL starts: keep their lines whole.
    with _print_lock:
        print(f"[infra] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- ports


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """True if nothing listens on ``host:port`` (a bind with SO_REUSEADDR succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_accepts(port: int, host: str = LOOPBACK, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- processes


def pid_alive(pid: int) -> bool:
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


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def child_pids(pid: int) -> list[int]:
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


def wait_until(check: Callable[[], bool], timeout: float, every: float = 0.05) -> bool:
    """Poll ``check`` until it is true or ``timeout`` passed; whether it became true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    return check()


def wait_gone(pids: Sequence[int], timeout: float) -> bool:
    return wait_until(lambda: not any(pid_alive(pid) for pid in pids), timeout)


def kill_tree(pid: int, what: str) -> None:
    """SIGKILL ``pid`` and its children (a server and its workers: a crash) and wait until
    all are gone; ``what`` names it in the error if one survives."""
    children = child_pids(pid)
    for victim in (pid, *children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    if not wait_gone([pid, *children], 30):
        raise InfraError(f"{what} (pid {pid}) survived SIGKILL")


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


# --------------------------------------------------------------------------- files


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no {path})"
    return "\n".join(text.splitlines()[-lines:])


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
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
