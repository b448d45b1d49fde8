"""CPU per part of the system sampled over time, for a window known only afterwards.

A hand-on's end is known once it is over, so ``CpuTimeline`` reads each process's CPU
seconds every ``period_s`` while a scenario runs, and ``cores`` then says how many cores each
part used on average between two instants. On a machine that hosts everything, it shows
whether a part was short of CPU: the raw broker's hand-on beside the product's, which shares
the same cores with the services, the manager and PostgreSQL. The processes and their parts
are found once, at the first reading (``profile.cpu_seconds``); later readings read only their
``/proc/<pid>/stat``, so a process started meanwhile is not counted, and sampling costs a few
hundredths of a core.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench import profile

Reading = tuple[float, dict[tuple[str, int], float]]


def _read(processes: list[tuple[str, int]]) -> dict[tuple[str, int], float]:
    used = {}
    for key in processes:
        try:
            stat = Path(f"/proc/{key[1]}/stat").read_text()
        except OSError:
            continue  # gone meanwhile (the node killed)
        used[key] = profile.stat_cpu_seconds(stat.rpartition(")")[2].split())
    return used


class CpuTimeline:
    def __init__(self, period_s: float = 0.1) -> None:
        self.period_s = period_s
        self.readings: list[Reading] = []

    async def run(self) -> None:
        """Reads until cancelled."""
        first = await asyncio.to_thread(profile.cpu_seconds)
        self.readings.append((time.monotonic(), first))
        while True:
            await asyncio.sleep(self.period_s)
            used = await asyncio.to_thread(_read, list(first))
            self.readings.append((time.monotonic(), used))

    def _span(self, began: float, ended: float) -> tuple[float, Reading, Reading] | None:
        before = [r for r in self.readings if r[0] <= began]
        after = [r for r in self.readings if r[0] >= ended]
        if not before or not after:
            return None
        return after[0][0] - before[-1][0], before[-1], after[0]

    def cores(self, began: float, ended: float) -> dict[str, float]:
        """Cores each part used on average from the last reading at or before ``began`` to the
        first at or after ``ended`` (``time.monotonic`` instants), and that window's length
        under ``"window_s"``; empty if the readings do not span it."""
        span = self._span(began, ended)
        if span is None:
            return {}
        window, (_, first), (_, last) = span
        used = profile.cpu_delta(first, last)
        return {part: round(seconds / window, 2) for part, seconds in used.items()} | {"window_s": round(window, 2)}

    def busiest(self, began: float, ended: float, part: str) -> list[float]:
        """Cores each process of ``part`` used over the same window, the busiest first: whether
        one process did the part's work alone."""
        span = self._span(began, ended)
        if span is None:
            return []
        window, (_, first), (_, last) = span
        each = [last[key] - first.get(key, 0.0) for key in last if key[0] == part]
        return sorted((round(seconds / window, 2) for seconds in each), reverse=True)


def cores_line(cores: dict[str, Any]) -> str:
    """``CpuTimeline.cores`` as one line: each part's cores, then the machine's total (and
    each service's, where they were counted)."""
    parts = {part: used for part, used in cores.items() if isinstance(used, float) and part != "window_s"}
    line = ", ".join(f"{part} {used:.2f}" for part, used in parts.items()) + f"; all {sum(parts.values()):.2f}"
    return line + (f" (each service: {cores['each service']})" if cores.get("each service") else "")
