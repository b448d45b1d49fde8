"""How many observers this service takes: ``ORCH_WORKERS_COUNT`` as a number, or ``auto``.

``auto`` sizes the service to its machine (or its container: cgroup v2 limits count)::

    memory      = MemAvailable (or the cgroup's memory.max, if lower) * ORCH_MEMORY_FRACTION
    workers     = min(cpus * ORCH_ASYNC_PER_CPU,     memory / ORCH_ASYNC_BUDGET_KB)
    process     = min(cpus * ORCH_PROCESSES_PER_CPU, memory / ORCH_PROCESS_BUDGET_MB)

``workers`` is the prefetch: the number of start messages the broker lets this service hold.
``process`` caps how many of them may run in child processes (``isolation: process``); a
start beyond it is handed back to the queue for a service with room. The budgets are
deliberately generous, well above what an idle ``ticker`` or a bare child process costs
(docs/observers.md, "Isolation", has the figures): real observers hold buffers and
connections.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from observer_service.settings import AUTO, AUTO_SLOTS, ServiceSettings


@dataclass(frozen=True)
class Budgets:
    async_per_cpu: int
    async_budget_kb: float
    processes_per_cpu: int
    process_budget_mb: float
    memory_fraction: float


@dataclass(frozen=True)
class Capacity:
    workers: int
    process_slots: int
    cpus: int
    memory_mb: float


def cpu_count() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup v2 CPU quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _read("/sys/fs/cgroup/cpu.max")
    if quota:
        limit, _, period = quota.partition(" ")
        if limit != "max" and period:
            cpus = min(cpus, max(1, int(int(limit) / int(period))))
    return max(1, cpus)


def available_memory_mb() -> float:
    """MemAvailable, capped by a cgroup v2 memory limit (what a container may still use)."""
    available = None
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) / 1024
    if available is None:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**20
    limit = _read("/sys/fs/cgroup/memory.max")
    if limit and limit != "max":
        used = int(_read("/sys/fs/cgroup/memory.current") or 0)
        available = min(available, (int(limit) - used) / 2**20)
    return max(0.0, available)


def auto_capacity(budgets: Budgets, cpus: int | None = None, memory_mb: float | None = None) -> Capacity:
    cpus = cpu_count() if cpus is None else cpus
    memory_mb = available_memory_mb() if memory_mb is None else memory_mb
    usable_mb = memory_mb * budgets.memory_fraction
    workers = min(cpus * budgets.async_per_cpu, int(usable_mb * 1024 / budgets.async_budget_kb))
    processes = min(cpus * budgets.processes_per_cpu, int(usable_mb / budgets.process_budget_mb))
    return Capacity(max(1, workers), max(0, min(processes, workers)), cpus, round(memory_mb, 1))


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def sized(settings: ServiceSettings) -> tuple[ServiceSettings, Capacity | None]:
    """The settings with ``auto`` replaced by numbers (and the computation, if any)."""
    if settings.workers_count != AUTO and settings.process_slots != AUTO_SLOTS:
        return settings, None
    budgets = Budgets(
        settings.async_per_cpu,
        settings.async_budget_kb,
        settings.processes_per_cpu,
        settings.process_budget_mb,
        settings.memory_fraction,
    )
    capacity = auto_capacity(budgets)
    workers = capacity.workers if settings.workers_count == AUTO else settings.workers_count
    slots = capacity.process_slots if settings.process_slots == AUTO_SLOTS else settings.process_slots
    return settings.model_copy(update={"workers_count": workers, "process_slots": min(slots, workers)}), capacity
