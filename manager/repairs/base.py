"""What a repair is to the loop that runs it (``manager/repairs/loop.py``)."""

from __future__ import annotations

from typing import Protocol


class Repair(Protocol):
    """One periodic repair of the state side: finds a disagreement and mends it.

    ``run`` is called every pass of the loop while ``period_s`` is 0, else at most once per
    ``period_s`` after it last succeeded; a run that raised runs again at the next pass.
    It raises ``BrokerUnavailable`` or a database error as they come: the loop decides what
    they mean for the other repairs."""

    name: str  # in the logs
    period_s: float = 0.0

    async def run(self) -> None: ...
