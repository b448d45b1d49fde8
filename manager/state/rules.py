"""The rules that turn service reports into the manager's truth (docs/design.md, invariant 4).
``StateRules.apply`` is the one dispatcher (a ``match`` on the message): the service reports
(born, heartbeat, goodbye, digest, inventory) are applied in ``service_reports.py``, the
observer reports in ``observer_reports.py``, both with what ``StateContext`` (``context.py``)
holds. Each runs inside the caller's transaction and returns the control messages to publish
*after* it commits.

Every write is a compare-and-set (``UPDATE ... WHERE status ... AND service_id ...``) so the
API and this consumer never overwrite each other, whatever order messages arrive in:
* a start or failure applies only if its sender is the observer's service, or the observer
  has no live service; a late report from an old service is ignored (a requested stop may be
  ended by any service that acked a copy, see ``observer_reports.stopped``);
* a start reported for an observer that is being or has been stopped is answered with a
  stop targeted at that service;
* a stop aimed at one copy names the broker session that holds it (``host_session_id``), so
  it never hits a newer copy the same service got since (X on A → B → back to A while the
  manager was behind: B's late start report must not stop X on A);
* an observer on probation reported running in its service's own process is isolated again;
* two services at once: the redelivered copy wins (the other service lost its channel), else the
  first one wins and the new copy (a duplicate start message) is stopped;
* inventories (the ids a service really runs) repair anything a lost or reordered
  message left wrong.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from manager.state import observer_reports, service_reports
from manager.state.context import StateContext
from manager.state.follow_ups import FollowUps
from shared.messages import (
    ObserverFailed,
    ObserverIsolated,
    ObserverReport,
    ObserverRetrying,
    ObserversDescribed,
    ObserversHandedOver,
    ObserversStarted,
    ObserverStopped,
    ReportBatch,
    ServiceBorn,
    ServiceDigest,
    ServiceHeartbeat,
    ServiceInventory,
    ServiceStopped,
    StartsDeclined,
    StartsGone,
    StateMessage,
)


class StateRules(StateContext):
    async def apply(self, session: AsyncSession, message: StateMessage, now: datetime) -> FollowUps:
        out = FollowUps()
        match message:
            case ServiceBorn() | ServiceHeartbeat() | ServiceStopped() | ServiceInventory() | ServiceDigest():
                await self._apply_service_report(session, message, now, out)
            case ObserverStopped() | ObserverRetrying() | ObserverFailed() | ObserverIsolated() | ReportBatch():
                for report in message.reports if isinstance(message, ReportBatch) else [message]:
                    await self._apply_observer_report(session, report, now, out)
            case ObserversStarted():
                await observer_reports.started_all(self, session, message, now, out)
            case ObserversHandedOver():
                await observer_reports.handed_over(self, session, message, now)
            case StartsDeclined():
                observer_reports.declined(self, session, message, now)
            case StartsGone():
                await observer_reports.starts_gone(self, session, message, now, out)
            case ObserversDescribed():
                await observer_reports.described(self, session, message, now, out)
        return out

    async def _apply_service_report(
        self,
        session: AsyncSession,
        report: ServiceBorn | ServiceHeartbeat | ServiceStopped | ServiceInventory | ServiceDigest,
        now: datetime,
        out: FollowUps,
    ) -> None:
        match report:
            case ServiceBorn():
                await service_reports.born(self, session, report, now, out)
            case ServiceHeartbeat():
                await service_reports.heartbeat(self, session, report, now, out)
            case ServiceStopped():
                await service_reports.service_gone(self, session, report.service_id, now)
            case ServiceInventory():
                await service_reports.inventory(self, session, report, now, out)
            case ServiceDigest():
                await service_reports.digest(self, session, report, now, out)

    async def _apply_observer_report(
        self, session: AsyncSession, report: ObserverReport, now: datetime, out: FollowUps
    ) -> None:
        match report:
            case ObserverStopped():
                await observer_reports.stopped(self, session, report, now)
            case ObserverRetrying():
                await observer_reports.retrying(self, session, report, now)
            case ObserverFailed():
                await observer_reports.failed(self, session, report, now)
            case ObserverIsolated():
                await observer_reports.isolated(self, session, report, now)
