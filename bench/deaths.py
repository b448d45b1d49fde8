"""False deaths: what the system did as if something had died while nothing had (issue 17).

Counted per scenario from outside the product, from every process's log and the database:
* services judged lost by the manager (its log: ``service NAME (ID) lost``), except those
  the scenario killed on purpose;
* broker sessions a service abandoned (``broker session lost``) and observers it fenced
  (``fenced N observer(s)``), except in the logs of services killed on purpose;
* observers that became Failed or went on probation.
A scenario that cuts every connection on purpose (the broker losing its data) counts only
the last two: there every session really ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import asyncpg

from tools.harness import Proc

_LOST = re.compile(r"service \S+ \(([0-9a-f-]{36})\) lost")
_FENCED = re.compile(r"fenced (\d+) observer")
_SESSION_LOST = "broker session lost"


@dataclass
class Deaths:
    services_lost: int = 0
    sessions_lost: int = 0
    fenced: int = 0
    failed: int = 0
    probation: int = 0
    cut: bool = False  # only failed and probation were counted

    def total(self) -> int:
        return self.services_lost + self.sessions_lost + self.fenced + self.failed + self.probation

    def text(self) -> str:
        return (
            f"services lost {self.services_lost}, sessions abandoned {self.sessions_lost}, "
            f"observers fenced {self.fenced}, failed {self.failed}, on probation {self.probation}"
        )


@dataclass
class Killed:
    """Services the bench killed on purpose, for the whole run: a death is judged a few
    heartbeats after the kill, maybe while the next scenario runs."""

    pids: set[int] = field(default_factory=set)
    service_ids: set[str] = field(default_factory=set)


@dataclass
class Ledger:
    """What each process's log said at the start of a scenario."""

    killed: Killed
    lines: dict[str, int] = field(default_factory=dict)  # log path -> lines already counted
    failed: int = 0
    probation: int = 0
    cut_all: bool = False  # the scenario cuts every connection on purpose


async def _db_counts(db: asyncpg.Connection) -> tuple[int, int]:
    failed = await db.fetchval("SELECT count(*) FROM observers WHERE status = 'Failed'")
    probation = await db.fetchval(
        "SELECT count(*) FROM observers WHERE probation_since IS NOT NULL "
        "AND status IN ('Created', 'Processing', 'OnDeleting')"
    )
    return int(failed), int(probation)


async def open_ledger(procs: list[Proc], db: asyncpg.Connection, killed: Killed) -> Ledger:
    ledger = Ledger(killed, lines={str(p.log): len(p.text().splitlines()) for p in procs})
    ledger.failed, ledger.probation = await _db_counts(db)
    return ledger


async def close_ledger(ledger: Ledger, procs: list[Proc], db: asyncpg.Connection) -> Deaths:
    deaths = Deaths()
    failed, probation = await _db_counts(db)
    deaths.failed = max(0, failed - ledger.failed)
    deaths.probation = max(0, probation - ledger.probation)
    if ledger.cut_all:
        deaths.cut = True
        return deaths
    for proc in procs:
        new = proc.text().splitlines()[ledger.lines.get(str(proc.log), 0) :]
        if proc.name == "manager":
            deaths.services_lost += sum(
                1 for line in new if (m := _LOST.search(line)) and m.group(1) not in ledger.killed.service_ids
            )
        elif proc.popen.pid not in ledger.killed.pids:
            deaths.sessions_lost += sum(1 for line in new if _SESSION_LOST in line)
            deaths.fenced += sum(int(m.group(1)) for line in new if (m := _FENCED.search(line)))
    return deaths
