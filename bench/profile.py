"""Sampling profiles of the product's processes during a benchmark scenario (``--profile``).

``py-spy record`` attaches to the manager and the services (no restart, no code change in
them) for the length of one scenario and writes collapsed stacks, one file per process, to
``bench/results/profile-<stamp>/<scenario>-<process>.txt``; ``summary`` prints the
functions with the most samples of their own ("self") and in total. Sampling costs a few
per cent of a core per process, so figures of a profiled run are not quoted.

``cpu_seconds`` reads what each part of the system (broker, database, manager, services,
the load generator) used from /proc, so every run says where the two cores went.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

RATE_HZ = 97  # not a divisor of the event loop's typical periods


def _py_spy() -> str | None:
    """py-spy on PATH, or installed next to this Python (the project's venv, not activated)."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def available() -> bool:
    return _py_spy() is not None


@contextlib.contextmanager
def profiled(out_dir: Path, scenario: str, pids: dict[str, int]) -> Iterator[None]:
    """Record every process in ``pids`` (name -> pid) while the block runs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    recorders = []
    for name, pid in pids.items():
        out = out_dir / f"{scenario}-{name}.txt"
        recorders.append(
            subprocess.Popen(
                [
                    _py_spy() or "py-spy",
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    str(RATE_HZ),
                    "--format",
                    "raw",
                    "-o",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    try:
        yield
    finally:
        for recorder in recorders:
            recorder.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for recorder in recorders:
            try:
                recorder.wait(30)
            except subprocess.TimeoutExpired:
                recorder.kill()
        for name in pids:
            out = out_dir / f"{scenario}-{name}.txt"
            if out.exists():
                print(f"  profile {scenario}/{name}: {out}\n{summary(out)}", flush=True)


def summary(path: Path, top: int = 15) -> str:
    """The functions that hold the most samples: self (the frame on top) and total."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f.split(" (")[0] + " " + f.split("/")[-1].rstrip(")") for f in stack.split(";")]
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    if not samples:
        return "    (no samples)"
    lines = [f"    {samples} samples; self:"]
    lines += [f"    {100 * c / samples:5.1f}%  {f}" for f, c in own.most_common(top)]
    lines.append("    total:")
    lines += [f"    {100 * c / samples:5.1f}%  {f}" for f, c in total.most_common(top)]
    return "\n".join(lines)


def children(pid: int) -> dict[str, int]:
    """The manager's state process, if it runs one (module name -> pid)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rpartition(")")[2].split()[1])
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            continue
        if ppid == pid and "manager.state_side" in cmdline:
            found["manager-state"] = int(proc.name)
    return found


def _group(cmdline: str) -> str | None:
    if "beam.smp" in cmdline:
        return "rabbitmq"
    if cmdline.startswith("postgres") or "/postgresql/" in cmdline:
        return "postgres"
    if "-m manager.state_side" in cmdline:
        return "manager (state)"
    if "-m manager" in cmdline:
        return "manager (api)"
    if "-m observer_service" in cmdline:
        return "services"
    if "-m bench" in cmdline:
        return "bench (load + raw)"
    return None


def cpu_seconds(roots: set[int] | None = None) -> dict[tuple[str, int], float]:
    """CPU seconds (user + system) used so far by each live process of each part; with
    ``roots``, only those processes and their children (another checkout's servers and
    tests on the same machine are left out). A process of no part counts with its parent's
    (a service's observer processes, a bench's consumers in processes of their own)."""
    groups: dict[int, str | None] = {}
    found: dict[int, tuple[int, list[str]]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (proc / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat.rpartition(")")[2].split()
        groups[int(proc.name)] = _group(cmdline)
        found[int(proc.name)] = (int(fields[1]), fields)
    used: dict[tuple[str, int], float] = {}
    for pid, (ppid, fields) in found.items():
        group = groups[pid] or groups.get(ppid)
        if group is None:
            continue
        if roots is not None and pid not in roots and ppid not in roots:
            continue
        used[(group, pid)] = stat_cpu_seconds(fields)
    return used


def stat_cpu_seconds(fields: list[str]) -> float:
    """User + system CPU seconds from the fields of a ``/proc/<pid>/stat`` (or a thread's
    ``/proc/<pid>/task/<tid>/stat``) after the command's closing parenthesis."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def broker_cpu() -> float:
    """CPU seconds used so far by every live RabbitMQ process on this machine."""
    return sum(s for (part, _pid), s in cpu_seconds().items() if part == "rabbitmq")


def cpu_delta(before: dict[tuple[str, int], float], after: dict[tuple[str, int], float]) -> dict[str, float]:
    """CPU seconds per part between two readings: a process started meanwhile counts from
    zero; one that died meanwhile (kill -9) takes its last seconds with it, so a part's
    figure is a lower bound in such scenarios."""
    parts: dict[str, float] = collections.defaultdict(float)
    for key, seconds in after.items():
        parts[key[0]] += seconds - before.get(key, 0.0)
    return {part: round(seconds, 2) for part, seconds in sorted(parts.items())}
