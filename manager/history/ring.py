"""The last hour of samples, in a bounded ring, and what the dashboard's charts read from it.

Pure: no database, no clock. A sample holds cumulative totals (observers ever counted,
Deleted, Failed, failovers seen) rather than rates, so a missed sample (the database
down) loses no event: the next step's difference carries it. Rates per minute are made
from the differences when asked (``per_minute``).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

WINDOW_S = 3600.0


@dataclass(frozen=True, slots=True)
class ServiceLoad:
    """One alive service at a sample: what it runs and how many workers it has."""

    id: str
    name: str
    running: int
    workers: int


@dataclass(frozen=True, slots=True)
class Sample:
    """What the manager knew at ``at`` (Unix seconds)."""

    at: float
    # Observers per status, in the order of ``History.statuses``.
    statuses: tuple[int, ...]
    # Cumulative totals since the sampler began (differences make the rates).
    created: int
    stopped: int
    failed: int
    failovers: int
    services: tuple[ServiceLoad, ...]


# The rates the dashboard plots, each a field of ``Sample``.
RATES = ("created", "stopped", "failed", "failovers")


def per_minute(samples: Sequence[Sample]) -> dict[str, list[int]]:
    """Events per wall-clock minute: each step's increase of a total goes to the minute its
    later sample falls in. A total that went down (a Failed observer restarted, an abandoned
    create's row deleted) counts as no increase rather than a negative rate."""
    minutes: list[int] = []
    sums: dict[str, list[int]] = {name: [] for name in RATES}
    for before, after in itertools.pairwise(samples):
        minute = math.floor(after.at / 60) * 60
        if not minutes or minutes[-1] != minute:
            minutes.append(minute)
            for series in sums.values():
                series.append(0)
        for name in RATES:
            sums[name][-1] += max(0, getattr(after, name) - getattr(before, name))
    return {"at": minutes, **sums}


class History:
    """A ring of the samples of the last ``window_s`` taken every ``period_s``: the oldest
    falls out as a new one comes in, so memory stays bounded whatever the uptime."""

    def __init__(self, period_s: float, statuses: Iterable[str], window_s: float = WINDOW_S) -> None:
        self.period_s = period_s
        self.window_s = window_s
        self.statuses = tuple(statuses)
        self.samples: deque[Sample] = deque(maxlen=max(2, math.ceil(window_s / period_s) + 1))

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)

    def as_json(self) -> dict[str, Any]:
        """Columns, one value per sample, for ``GET /api/history``: a service's columns hold
        None where it was not alive."""
        samples = list(self.samples)
        names: dict[str, str] = {}
        for sample in samples:
            for load in sample.services:
                names[load.id] = load.name  # its latest name
        services = []
        for service_id, name in sorted(names.items(), key=lambda item: (item[1], item[0])):
            loads = [next((s for s in sample.services if s.id == service_id), None) for sample in samples]
            services.append(
                {
                    "id": service_id,
                    "name": name,
                    "running": [load.running if load else None for load in loads],
                    "workers": [load.workers if load else None for load in loads],
                }
            )
        return {
            "period_s": self.period_s,
            "window_s": self.window_s,
            "at": [sample.at for sample in samples],
            "observers": {status: [sample.statuses[i] for sample in samples] for i, status in enumerate(self.statuses)},
            "services": services,
            "per_minute": per_minute(samples),
        }
