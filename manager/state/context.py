"""What the rules of the state side share (``rules.py``, ``service_reports.py``,
``observer_reports.py``): the rows of the transaction being applied (``rows_of``,
``services_of``, read in one query each by ``preload``), whether a service is known and alive,
asking an unknown one to introduce itself, and the notes in memory that outlive one message
(suspicions, hand-overs, placements, declines, gone starts), which the repairs read too."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession

from manager.balance.handovers import Handovers
from manager.balance.plan import Placed
from manager.balance.retire import QueueHeld
from manager.db.models import ObserverStatus, ServiceStatus
from manager.state.declines import Declines
from manager.state.follow_ups import FollowUps
from manager.state.probation import ProbationPolicy
from manager.state.rows import ObserverRows, ServiceRows
from shared.messages import (
    OBSERVER_REPORT_TYPES,
    ObserversHandedOver,
    ObserversStarted,
    ReportBatch,
    ServiceBorn,
    ServiceHeartbeat,
    ServiceStopped,
    StartsDeclined,
    StartsGone,
    StateMessage,
)

logger = logging.getLogger(__name__)

S = ObserverStatus
STOPPING_OR_GONE = (S.ON_DELETING, S.DELETED, S.FAILED)
# Service messages whose rules write the service without reading it first (``preload``).
_WRITTEN_WITHOUT_READING = (ServiceHeartbeat, ServiceBorn, ServiceStopped, StartsDeclined)


@dataclass
class Suspicions:
    """In-memory notes that outlive one message (lost on restart; inventories rebuild them).

    * unknown: ids reported running that have no row: stopped after a grace, in case the
      row's commit is still in flight (``background``);
    * conflicts: observer -> the other service (and its session) that listed it while its
      service is alive; resolved when that service's own inventory arrives.
    """

    unknown: dict[uuid.UUID, tuple[uuid.UUID, float]] = field(default_factory=dict)
    conflicts: dict[uuid.UUID, tuple[uuid.UUID, uuid.UUID | None]] = field(default_factory=dict)


class StateContext:
    def __init__(self, probation: ProbationPolicy, start_queues: int = 1) -> None:
        self.probation = probation
        self.start_queues = start_queues  # ``ORCH_START_QUEUES``: told to each service at its birth
        self.suspicions = Suspicions()
        # When a takeover from each service was last applied (monotonic seconds): while a dead
        # service's share is still moving, its death waits (``manager/repairs/liveness.py``).
        self.moved_from_at: dict[uuid.UUID, float] = {}
        # The hand-overs the balancer asked for, and the placement (and how many start queues
        # of each pool) each service's last heartbeat said it consumes under
        # (``manager/balance/rounds.py``).
        self.handovers = Handovers()
        self.placements: dict[uuid.UUID, tuple[Placed, int]] = {}
        # The starts each service's last heartbeat said it holds from each start queue index
        # (``manager/balance/retire.py``).
        self.queue_held: dict[uuid.UUID, QueueHeld] = {}
        # The starts services declined (they cannot run them), held or on their way.
        self.declines = Declines()
        # Observers whose start went with a deleted start queue, pending, for the gone-start
        # repair to publish again: added once the batch that made them pending committed.
        self.gone_starts: set[uuid.UUID] = set()
        # The rows of the transaction being applied (set by ``preload``).
        self._rows: tuple[ObserverRows, ServiceRows] | None = None

    async def introduce_if_unknown(self, session: AsyncSession, service_id: uuid.UUID, out: FollowUps) -> None:
        """A service speaks that has no row: its ServiceBorn was lost (dead-lettered while
        the database refused connections) or the database was restored from an older
        backup. Ask it to introduce itself again; until then its reports about observers
        count as from a service that is not alive.

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
        await services.preload(service_ids | rows.services())

    def committed(self, follow_ups: FollowUps) -> None:
        """The batch that decided ``follow_ups`` committed: its gone starts are the repair's now
        (before, its transaction would not see them pending, and would forget them)."""
        self.gone_starts.update(follow_ups.gone_starts)

    async def flush(self, session: AsyncSession) -> None:
        """Write the changed rows; call before the transaction commits."""
        await self.rows_of(session).flush()
