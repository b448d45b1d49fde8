"""``observer_service.capacity``: ``auto`` takes the scarcer of CPU and memory."""

from __future__ import annotations

from observer_service.capacity import Budgets, auto_capacity


def test_auto_capacity_takes_the_scarcer_of_cpu_and_memory() -> None:
    budgets = Budgets(
        async_per_cpu=5000, async_budget_kb=64, processes_per_cpu=8, process_budget_mb=64, memory_fraction=0.5
    )
    roomy = auto_capacity(budgets, cpus=2, memory_mb=24_000)
    assert roomy.workers == 10_000 and roomy.process_slots == 16  # CPU-bound
    tight = auto_capacity(budgets, cpus=16, memory_mb=1000)
    assert tight.workers == 8000 and tight.process_slots == 7  # memory-bound: 500 MiB usable
