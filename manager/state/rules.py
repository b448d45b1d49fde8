"""The rules that turn service reports into the manager's truth (docs/design.md, invariant 4).
``StateRules.apply`` is the one dispatcher (a ``match`` on the message): the service reports
(born, heartbeat, goodbye, digest, inventory) are applied here, the observer reports in
``observer_reports.py``. Each runs inside the caller's transaction and returns the control
messages to publish *after* it commits.

Every write is a compare-and-set (``UPDATE ... WHERE status ... AND service_id ...``) so the
API and this consumer never overwrite each other, whatever order messages arrive in:
* a start or failure applies only if its sender is the observer's host, or the observer
  has no live host; a late report from an old host is ignored (a requested stop may be
  ended by any service that acked a copy, see ``observer_reports.stopped``);
* a start reported for an observer that is being or has been stopped is answered with a
  stop targeted at that host;
* a stop aimed at one copy names the broker session that holds it (``host_session_id``), so
  it never hits a newer copy the same host got since (X on A → B → back to A while the
  manager was behind: B's late start report must not stop X on A);
* an observer on probation reported running in its host's own process is isolated again;
* two hosts at once: the redelivered copy wins (the other host lost its channel), else the
  first one wins and the new copy (a duplicate start message) is stopped;
* inventories (the ids a service really runs) repair anything a lost or reordered
  message left wrong.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from manager.balance.handovers import Handovers
from manager.balance.plan import Placed
from manager.db import observers
from manager.db.digests import held_digest
from manager.db.hosts import ids_on
from manager.db.models import EventType, Observer, ObserverStatus, ServiceStatus
from manager.db.sql import id_in
from manager.metrics import DIGEST_MISMATCHES, DIGESTS_COMPARED
from manager.state import observer_reports
from manager.state.declines import Declines
from manager.state.follow_ups import FollowUps
from manager.state.observer_reports import STOPPING_OR_GONE
from manager.state.probation import ProbationPolicy, host_died
from manager.state.rows import ObserverRows, Row, ServiceRows
from shared.messages import (
    OBSERVER_REPORT_TYPES,
    InventoryRequest,
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

logger = logging.getLogger(__name__)

S = ObserverStatus
# Service messages whose rules write the service without reading it first (``preload``).
_WRITTEN_WITHOUT_READING = (ServiceHeartbeat, ServiceBorn, ServiceStopped, StartsDeclined)


@dataclass
class Suspicions:
    """In-memory notes that outlive one message (lost on restart; inventories rebuild them).

    * unknown: ids reported running that have no row: stopped after a grace, in case the
      row's commit is still in flight (``background``);
    * conflicts: observer -> the other service (and its session) that listed it while its
      host is alive; resolved when the host's own inventory arrives.
    """

    unknown: dict[uuid.UUID, tuple[uuid.UUID, float]] = field(default_factory=dict)
    conflicts: dict[uuid.UUID, tuple[uuid.UUID, uuid.UUID | None]] = field(default_factory=dict)


class StateRules:
    def __init__(self, probation: ProbationPolicy) -> None:
        self.probation = probation
        self.suspicions = Suspicions()
        # When a takeover from each host was last applied (monotonic seconds): while a dead
        # host's share is still moving, its death waits (``manager/repairs/liveness.py``).
        self.moved_from_at: dict[uuid.UUID, float] = {}
        # The hand-overs the balancer asked for, and the placement each service's last
        # heartbeat said it consumes under (``manager/repairs/balance.py``).
        self.handovers = Handovers()
        self.placements: dict[uuid.UUID, Placed] = {}
        # The starts services declined (they cannot run them), held or on their way.
        self.declines = Declines()
        # Observers whose start went with a deleted start queue, pending, for the gone-start
        # repair to publish again (an id whose row a rolled-back batch did not change is skipped).
        self.gone_starts: set[uuid.UUID] = set()
        # The rows of the transaction being applied (set by ``preload``).
        self._rows: tuple[ObserverRows, ServiceRows] | None = None

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
                await observer_reports.starts_gone(self, session, message, now)
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
                await self._born(session, report, now, out)
            case ServiceHeartbeat():
                await self._heartbeat(session, report, now, out)
            case ServiceStopped():
                await self._service_gone(session, report.service_id, now)
            case ServiceInventory():
                await self._inventory(session, report, now, out)
            case ServiceDigest():
                await self._digest(session, report, now, out)

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

    # --- services ------------------------------------------------------------------------

    async def _born(self, session: AsyncSession, m: ServiceBorn, now: datetime, out: FollowUps) -> None:
        services = self.services_of(session)
        for old in await services.namesakes(m.name, m.service_id):
            await services.delete(old.id, now)
            logger.info("service %s (%s) restarted as %s: old instance deleted", m.name, old.id, m.service_id)
            if old.status == ServiceStatus.ALIVE:
                # It died without a word (a lost one was counted when judged lost).
                isolate = await host_died(self.rows_of(session), old.id, old.last_heartbeat_at, now, self.probation)
                for observer_id, host in isolate.items():
                    out.isolate(observer_id, host)
            await self._release_observers(session, old.id, now)
        await services.born(m, now)

    async def _heartbeat(self, session: AsyncSession, m: ServiceHeartbeat, now: datetime, out: FollowUps) -> None:
        services = self.services_of(session)
        self.placements[m.service_id] = (m.priority, m.cordoned, tuple(sorted(m.pool_priorities.items())))
        if not await services.touch(m.service_id, now, m.running, m.session_id, m.loop_lag_ms, m.refused):
            await self.introduce_if_unknown(session, m.service_id, out)

    async def introduce_if_unknown(self, session: AsyncSession, service_id: uuid.UUID, out: FollowUps) -> None:
        """A service speaks that has no row: its ServiceBorn was lost (dead-lettered while
        the database refused connections) or the database was restored from an older
        backup. Ask it to introduce itself again; until then its reports about observers
        count as from a host that is not alive.

        A service that was deleted yet still heartbeats was replaced by another one born
        under its name while it lived: two services share a name (the default is the host
        name, so two on one host do). Its observers were released and would stay Created:
        it is asked to take a name of its own and introduce itself again."""
        service = await self.services_of(session).get(service_id)
        if service is None:
            out.introduce(service_id)
        elif service.status == ServiceStatus.DELETED:
            logger.warning(
                "service %s (%s) was replaced by another one born under its name but still runs: "
                "asking it to take a name of its own (set ORCH_SERVICE_NAME per service)",
                service.name,
                service_id,
            )
            out.introduce(service_id, name_taken=True)

    async def _service_gone(self, session: AsyncSession, service_id: uuid.UUID, now: datetime) -> None:
        await self.services_of(session).delete(service_id, now, running=0)
        await self._release_observers(session, service_id, now)

    async def _release_observers(self, session: AsyncSession, service_id: uuid.UUID, now: datetime) -> None:
        """The host is gone: its observers wait, hostless, for a new start report."""
        rows_of = self.rows_of(session)
        for obs in await rows_of.hosted_by(service_id):
            obs.host(None)
            obs.modified_at = now
            if obs.status == S.PROCESSING:
                obs.status = S.CREATED
            rows_of.event(obs.id, EventType.RELEASED, now, from_service_id=service_id)

    async def _digest(self, session: AsyncSession, m: ServiceDigest, now: datetime, out: FollowUps) -> None:
        """Compare a service's digest with the rows; ask for its whole inventory if they differ."""
        if not await self.services_of(session).touch(m.service_id, now, m.count, m.session_id):
            await self.introduce_if_unknown(session, m.service_id, out)
            return
        await self.rows_of(session).flush()  # the digest is read from the rows as changed so far
        count, digest = await held_digest(session, m.service_id, m.session_id)
        DIGESTS_COMPARED.inc()
        if (count, digest) != (m.count, m.digest):
            DIGEST_MISMATCHES.inc()
            logger.info(
                "service %s runs %d observer(s), the rows say %d (or other ones): asking for its inventory",
                m.service_id,
                m.count,
                count,
            )
            out.messages.append(InventoryRequest(service_id=m.service_id))

    async def _inventory(self, session: AsyncSession, m: ServiceInventory, now: datetime, out: FollowUps) -> None:
        """Reconcile what a service really runs. Only rows that disagree are loaded: in the
        steady state an inventory of 30,000 ids costs two index scans, no Python per id."""
        if not await self.services_of(session).touch(m.service_id, now, len(m.observer_ids), m.session_id):
            await self.introduce_if_unknown(session, m.service_id, out)
            return
        sid = m.service_id
        listed = set(m.observer_ids)
        if await observers.count_existing(session, listed) != len(listed):
            found = await observers.existing_ids(session, listed)
            for oid in listed - found:
                self.suspicions.unknown.setdefault(oid, (sid, time.monotonic()))
        running_here = (
            (Observer.status == S.PROCESSING)
            & (Observer.service_id == sid)  # judged on rows found by id: no lookup by host
            & Observer.host_session_id.is_not_distinct_from(m.session_id)
        )
        held = (S.PROCESSING, S.ON_DELETING)
        on_host = id_in(Observer.id, await ids_on(session, sid))  # an OR below: see ids_on
        held_here = on_host & (Observer.service_id == sid) & Observer.status.in_(held)
        conflicts = self.suspicions.conflicts

        def disagrees(row: Row) -> bool:  # the query's condition, for the rows cached in this batch
            if row.id in listed:
                here = row.status == S.PROCESSING and row.service_id == sid and row.host_session_id == m.session_id
                return not here or row.id in conflicts
            return (row.service_id == sid and row.status in held) or row.id in conflicts

        rows = await self.rows_of(session).matching(
            (id_in(Observer.id, listed) & ~running_here)
            | (held_here & ~id_in(Observer.id, listed))
            | id_in(Observer.id, conflicts),
            disagrees,
        )
        for obs in rows:
            if obs.id in listed or obs.service_id == sid:  # conflicts of other hosts wait for theirs
                await self._reconcile(session, obs, m, obs.id in listed, now, out)

    async def _reconcile(
        self, session: AsyncSession, obs: Row, m: ServiceInventory, listed: bool, now: datetime, out: FollowUps
    ) -> None:
        sid = m.service_id
        conflicting = self.suspicions.conflicts.pop(obs.id, None) if obs.service_id == sid else None
        if not listed:
            if obs.status == S.PROCESSING:
                # Not running where we thought: another copy (conflicting) or nobody.
                obs.host(*(conflicting or (None, None)))
                obs.status = S.PROCESSING if conflicting else S.CREATED
                obs.modified_at = now
            return
        if conflicting is not None:
            out.stop(obs.id, conflicting[0], "duplicate: also running on its host", conflicting[1])
        if obs.status in STOPPING_OR_GONE:
            out.stop(obs.id, sid, f"observer is {obs.status.value}", m.session_id)
            return
        if obs.service_id in (None, sid) or not await self.service_in(session, obs.service_id, (ServiceStatus.ALIVE,)):
            if obs.status != S.PROCESSING or obs.service_id != sid or obs.host_session_id != m.session_id:
                obs.status, obs.modified_at = S.PROCESSING, now
                obs.host(sid, m.session_id)
            return
        # Listed here but hosted by another live service: ask that host what it runs.
        self.suspicions.conflicts[obs.id] = (sid, m.session_id)
        out.messages.append(InventoryRequest(service_id=obs.service_id))

    async def service_in(
        self, session: AsyncSession, service_id: uuid.UUID | None, statuses: tuple[ServiceStatus, ...]
    ) -> bool:
        """Whether the service is known and in one of ``statuses``. A lost service may still
        report (it was only slow), but its observers are up for grabs: the broker moves
        them when its connection really died."""
        if service_id is None:
            return False
        service = await self.services_of(session).get(service_id)
        return service is not None and service.status in statuses

    def rows_of(self, session: AsyncSession) -> ObserverRows:
        return self._transaction(session)[0]

    def services_of(self, session: AsyncSession) -> ServiceRows:
        return self._transaction(session)[1]

    def _transaction(self, session: AsyncSession) -> tuple[ObserverRows, ServiceRows]:
        """The rows of ``session``'s transaction: none cached yet if it is a new one."""
        if self._rows is None or self._rows[0].session is not session:
            self._rows = ObserverRows(session), ServiceRows(session)
        return self._rows

    async def preload(self, session: AsyncSession, messages: list[StateMessage]) -> None:
        """Load, in one query each, every observer (locked) and service (not locked: see
        ``ServiceRows``) a batch of reports mentions, so applying them finds the rows in
        memory. Observers first: the consumer locks them before any service row.

        A service that only heartbeats, is born or says goodbye in the batch is not read: its
        rules write it with one statement that returns the row (``ServiceRows``). An idle
        fleet's batches are lone heartbeats, and reading the service first was one more
        round trip in each (issue 17: an idle million must cost almost nothing)."""
        self._rows = None
        rows, services = self._transaction(session)
        observer_ids: set[uuid.UUID] = set()
        service_ids: set[uuid.UUID] = set()
        for message in messages:
            if isinstance(message, ObserversStarted | ObserversHandedOver | StartsGone):
                observer_ids.update(message.observer_ids)
            reports = message.reports if isinstance(message, ReportBatch) else [message]
            for report in reports:
                if isinstance(report, OBSERVER_REPORT_TYPES):
                    observer_ids.add(report.observer_id)
                if not isinstance(report, _WRITTEN_WITHOUT_READING):
                    service_ids.add(report.service_id)
        await rows.preload(observer_ids)
        await services.preload(service_ids | rows.hosts())

    async def flush(self, session: AsyncSession) -> None:
        """Write the changed rows; call before the transaction commits."""
        await self.rows_of(session).flush()
