"""Who is in the way of a server about to start: the process behind an Erlang node name
registered with epmd or behind a listening port, and how to clear it.

Why this exists: a checkout deleted while its servers ran leaves them running, and a new
checkout at the same path derives the same RabbitMQ node name (a hash of the path), which
epmd then refuses. Nothing in the new checkout (pid file, data folder) knows that process, so
``up`` names it, says where it came from and gives the command that clears it, instead of
"pick another name" for a name nobody picked.

The process lookups read ``/proc`` (no ``ss`` or ``lsof`` needed); the parsing and the
messages are pure functions, tested in ``tests/system/test_infra.py``.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tools.infra.system import LOOPBACK, cmdline

EPMD_PORT = 4369
_TCP_LISTEN = "0A"  # the st column of /proc/net/tcp*
_UP_AGAIN = "python3 -m tools.infra up"


def epmd_names(port: int = EPMD_PORT) -> dict[str, int]:
    """Erlang node names registered with the local epmd, with their distribution ports."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=2.0) as sock:
            sock.sendall(b"\x00\x01n")  # NAMES_REQ
            chunks: list[bytes] = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
    except OSError:
        return {}
    return parse_epmd_names(b"".join(chunks))


def parse_epmd_names(answer: bytes) -> dict[str, int]:
    """The NAMES_RESP of epmd: 4 bytes (its own port), then ``name X at port N`` lines."""
    names: dict[str, int] = {}
    for line in answer[4:].decode(errors="replace").splitlines():
        match = re.fullmatch(r"name (\S+) at port (\d+)", line.strip())
        if match:
            names[match.group(1)] = int(match.group(2))
    return names


def parse_listening(proc_net_tcp: str) -> dict[int, set[int]]:
    """Listening TCP ports and their socket inodes, from the text of /proc/net/tcp or tcp6
    (any local address: a server on 0.0.0.0 or :: holds the port on 127.0.0.1 too)."""
    found: dict[int, set[int]] = {}
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _TCP_LISTEN:
            continue
        try:
            port = int(fields[1].rsplit(":", 1)[1], 16)
            inode = int(fields[9])
        except (IndexError, ValueError):
            continue
        found.setdefault(port, set()).add(inode)
    return found


@dataclass(frozen=True)
class Holder:
    """What /proc says about a process; empty fields where it may not be read (another user)."""

    pid: int
    command: str = ""
    # The kernel appends " (deleted)" to a working folder that no longer exists.
    cwd: str = ""
    environ: Mapping[str, str] = field(default_factory=dict)

    @property
    def cwd_deleted(self) -> bool:
        return self.cwd.endswith(" (deleted)")

    @property
    def program(self) -> str:
        return os.path.basename(self.command.split(" ", 1)[0]) if self.command else "?"

    def describe(self) -> str:
        where = f", working folder {self.cwd}" if self.cwd else ""
        return f"pid {self.pid} ({self.program}{where})"


def holder(pid: int) -> Holder:
    proc = Path(f"/proc/{pid}")
    try:
        cwd = os.readlink(proc / "cwd")
    except OSError:
        cwd = ""
    try:
        raw = (proc / "environ").read_bytes()
    except OSError:
        raw = b""
    environ = dict(item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)
    return Holder(pid=pid, command=cmdline(pid).strip(), cwd=cwd, environ=environ)


def listening_holder(port: int) -> Holder | None:
    """The process listening on ``port``, or None when nobody does or it cannot be seen (the
    sockets of another user's processes are hidden unless we are root)."""
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            inodes |= parse_listening(Path(table).read_text()).get(port, set())
        except OSError:
            continue
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    owners = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit() and _holds(entry, targets)]
    # A forked child may share the socket: the lowest pid is normally the parent.
    return holder(min(owners)) if owners else None


def _holds(proc: Path, targets: set[str]) -> bool:
    """Whether one of the open files of the process ``/proc/<pid>`` is one of ``targets``."""
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:  # gone meanwhile, or not ours to read
        return False
    for fd in fds:
        try:
            if os.readlink(fd) in targets:
                return True
        except OSError:  # closed meanwhile (listing its own fds, a process closes one)
            continue
    return False


def _clear_hint(found: Holder | None, port: int, pid_file: Path | None, other: str) -> str:
    """Where the process came from and what to do; ``other`` is what this node could change
    instead ("name", "port") when the process may be someone else's."""
    if found is None:
        return (
            f"Find it with `ss -ltnp 'sport = :{port}'` (as root to see every user's processes), "
            f"stop it, then run `{_UP_AGAIN}` again."
        )
    kill = f"kill {found.pid}        # and if it is still there a minute later: kill -9 {found.pid}"
    origin = found.environ.get("RABBITMQ_PID_FILE")
    if pid_file is not None and origin == str(pid_file):
        if found.cwd_deleted:
            why = (
                "It is a RabbitMQ started at this same path by a checkout that was deleted while it "
                "ran (its working folder is gone); nothing here knows it any more."
            )
        else:
            why = f"It was started from this base folder, but {pid_file} no longer names it."
        return f"{why}\nStop it, then run `{_UP_AGAIN}` again:\n    {kill}"
    if origin:
        why = f"It belongs to another base folder (its pid file: {origin})."
    elif found.cwd_deleted:
        why = "Its working folder was deleted."
    else:
        why = "Nothing says it is one of ours."
    return f"{why}\nIf it should not run, stop it:\n    {kill}\nelse give this node another {other}."


def node_name_taken(node: str, dist_port: int, pid_file: Path, found: Holder | None) -> str:
    """The error for a node name that epmd already knows and our pid file does not."""
    by = found.describe() if found is not None else "a process this user cannot see"
    return (
        f"rabbitmq: node name {node!r} is already registered with epmd (distribution port "
        f"{dist_port}) by {by}, which {pid_file} does not name.\n" + _clear_hint(found, dist_port, pid_file, "name")
    )


def port_taken(label: str, port: int, found: Holder | None, pid_file: Path | None = None) -> str:
    """The error for a port that a process we did not start listens on; ``label`` names the
    port ("postgres: port"), ``pid_file`` is the RabbitMQ node's that would own it."""
    by = found.describe() if found is not None else "a process this user cannot see"
    return f"{label} {port} is in use by {by}.\n" + _clear_hint(found, port, pid_file, "port")
