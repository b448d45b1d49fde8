"""The one loop that runs the state side's repairs, a pass per ``ORCH_REPAIR_INTERVAL_S``.

A repair whose own threshold is long runs at a quarter of it (its ``period_s``): checking a
60-s condition every second only costs, and every repair on every pass kept the idle state
process busy at any size (figures: docs/design.md, "Where the time goes"). A failed repair
runs again next pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.balance.rounds import BalanceRound
from manager.broker import BrokerLink
from manager.db.errors import database_outage, describe, is_transient
from manager.repairs.base import Repair
from manager.repairs.housekeeping import EndProbations, FoldDeltas, ForgetApplied, ForgetServices, PruneHistory
from manager.repairs.liveness import JudgeHeartbeats
from manager.repairs.lost_starts import LostStarts
from manager.repairs.pending_starts import GoneStarts, PendingStarts
from manager.repairs.rebuild import BrokerRebuild
from manager.repairs.restop import Restop
from manager.repairs.unknown import DescribeUnknown
from manager.settings import ManagerSettings
from manager.start_publisher import StartPublisher
from manager.state.context import StateContext
from shared.errors import BrokerUnavailable

logger = logging.getLogger(__name__)


def state_side_repairs(
    settings: ManagerSettings,
    sessions: async_sessionmaker[AsyncSession],
    broker: BrokerLink,
    context: StateContext,
    starts: StartPublisher,
    consumer_idle: Callable[[], bool],
) -> list[Repair]:
    """Every repair, in the order a pass runs them: the broker rebuilt first, since the
    others publish to it; the balancer's round last (no repair, but run as one)."""
    heartbeats = JudgeHeartbeats(settings, sessions, broker, context, consumer_idle)
    return [
        BrokerRebuild(sessions, starts),
        Restop(sessions, broker, settings.restop_after_s),
        heartbeats,
        GoneStarts(sessions, starts, context.gone_starts),
        PendingStarts(sessions, starts, settings.pending_start_after_s),
        LostStarts(sessions, starts, context.declines, settings.lost_start_after_s),
        DescribeUnknown(sessions, broker, context, settings.unknown_grace_s),
        EndProbations(sessions),
        ForgetApplied(sessions, lambda: heartbeats.backlog_drained),
        PruneHistory(sessions, settings.events_retention_days),
        ForgetServices(sessions, broker, settings.start_queues, settings.services_retention_s),
        FoldDeltas(sessions),
        BalanceRound(settings, sessions, broker, context.handovers, context.placements, context.queue_held),
    ]


class Schedule:
    """When each repair is due: those without a period every pass, the others ``period_s``
    after they last succeeded."""

    def __init__(self, repairs: Sequence[Repair]) -> None:
        self.periods = {repair.name: repair.period_s for repair in repairs}
        self._next: dict[str, float] = {}

    def due(self, name: str, now: float) -> bool:
        return now >= self._next.get(name, 0.0)

    def ran(self, name: str, now: float) -> None:
        self._next[name] = now + self.periods.get(name, 0.0)


class RepairLoop:
    def __init__(
        self,
        repairs: Sequence[Repair],
        broker: BrokerLink,
        interval_s: float,
        on_database_error: Callable[[], None] | None = None,
    ) -> None:
        self.repairs = repairs
        self.broker = broker
        self.interval_s = interval_s
        self._database = database_outage("background repairs", logger, on_database_error)

    async def run(self) -> None:
        schedule = Schedule(self.repairs)
        while True:
            # A reconnection ends the wait: the rebuild after a broker lost its data starts
            # then, not at the next pass (up to an interval later).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.broker.reconnected.wait(), self.interval_s)
            self.broker.reconnected.clear()
            if not self.broker.ready.is_set():
                continue
            for repair in self.repairs:
                if not schedule.due(repair.name, time.monotonic()):
                    continue
                try:
                    await repair.run()
                    schedule.ran(repair.name, time.monotonic())  # a failed repair runs next pass
                except BrokerUnavailable as e:
                    logger.warning("%s: broker unavailable (%s)", repair.name, e)
                    break
                except Exception as e:
                    if not is_transient(e):
                        logger.exception("background step %s failed", repair.name)
                        continue
                    # Unreachable or a lost race: the other repairs need the database too, so
                    # wait for the next pass; a line when it begins, not a traceback per repair.
                    self._database.failed(describe(e))
                    break
            else:
                # A whole pass without a database failure: the repair that failed last pass
                # (due again at once) succeeded in this one.
                self._database.worked()
