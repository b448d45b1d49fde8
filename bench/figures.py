"""What a bench reports: a ``Figure`` (a value beside its target, and its verdict), and the
measuring helpers several benches share (a process's RSS, percentiles, timed API calls, the
samples of a metrics page)."""

from __future__ import annotations

import gc
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from shared.gc_pause import paused_collection


@dataclass
class Figure:
    scenario: str
    name: str
    value: float
    unit: str
    target: float | None = None
    higher_is_better: bool = True
    target_text: str = "-"
    note: str = ""
    decimals: int | None = None  # None: 1 from 100 up, else 3

    def shown(self) -> str:
        if self.decimals is not None:
            return f"{self.value:,.{self.decimals}f} {self.unit}"
        return f"{self.value:,.1f} {self.unit}" if self.value >= 100 else f"{self.value:,.3f} {self.unit}"

    def ratio(self) -> float | None:
        if self.target is None or self.target == 0 or self.value == 0:
            return None
        return self.value / self.target if self.higher_is_better else self.target / self.value

    def ratio_text(self) -> str:
        ratio = self.ratio()
        return "-" if ratio is None else f"{ratio:.2f}"

    def verdict(self) -> str:
        if self.target == 0:  # a count that must be nil (false deaths)
            return "pass" if self.value == 0 else "FAIL"
        ratio = self.ratio()
        return "" if self.target is None else ("pass" if ratio is not None and ratio >= 1 else "FAIL")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ratio": self.ratio(), "verdict": self.verdict()}


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def latencies_ms(call: Callable[[], Awaitable[httpx.Response]], count: int) -> list[float]:
    """``count`` calls one after another, each one's time until its answer, in ms.

    With the bench's own collector paused (after a full collection): the bench holds every
    id it created, and a full collection of its heap paused it 64 to 75 ms at a time while
    it timed API calls (a ``gc.callbacks`` probe, ``--only scale``; up to 732 ms while it
    created 100,000), which the call then seemed to take."""
    gc.collect()
    latencies = []
    with paused_collection():
        for _ in range(count):
            began = time.monotonic()
            (await call()).raise_for_status()
            latencies.append((time.monotonic() - began) * 1000)
    return latencies


def samples(text: str) -> list[tuple[str, float]]:
    """The samples of a Prometheus text page, each its name with labels and its value; split
    at the last space, since a label value may hold one (reason="even load")."""
    found = []
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name and not line.startswith("#"):
            found.append((name, float(value)))
    return found
