"""Operations that change observers: create and stop, one or many at a time.

Create = insert the rows (Created) with a ``pending_starts`` row each, publish their start
messages with confirms, then delete the pending rows. A crash between the two steps leaves
pending rows that the pending-start repair publishes again. A broker that refuses any start
gives 503 and leaves no row (a start that was confirmed meanwhile runs as an unknown
observer and is stopped after ``ORCH_UNKNOWN_GRACE_S``). A bulk request is all-or-nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager import schedule
from manager.admission import Admission
from manager.balance import fleet as fleet_rows
from manager.balance.plan import drain_note
from manager.broker import BrokerLink
from manager.create_groups import CreateGroups
from manager.create_result import CreatedObserver, created_row
from manager.db import creates, observers, services
from manager.db import schedule as schedule_rows
from manager.db.creates import NewSchedule
from manager.db.errors import describe, is_transient
from manager.db.events import NewEvent, insert_events
from manager.db.models import (
    FINAL_STATUSES,
    EventType,
    Observer,
    ObserverStatus,
    PendingStart,
    Service,
)
from manager.db.retry import retry_lost_races
from manager.errors import Conflict, Invalid, NoCapacity, NotFound, Unavailable
from manager.kinds import CatalogCache, KindCatalog, NewObserver, validate
from manager.start_messages import build_start, start_message
from manager.start_publisher import StartPublisher
from shared.errors import BrokerUnavailable
from shared.messages import RetryPolicy, StartObserver, stop_messages

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StopResult:
    stopping: list[uuid.UUID]  # now (or already) OnDeleting
    final: list[uuid.UUID]  # already Deleted or Failed
    unknown: list[uuid.UUID]
    cancelled: list[uuid.UUID]  # were Scheduled: now Deleted, never started


class ObserverCommands:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        broker: BrokerLink,
        default_retry: RetryPolicy,
        admission: Admission,
        schedule_max_ahead_days: float = 366.0,
        starts: StartPublisher | None = None,
    ) -> None:
        self.sessions = sessions
        self.schedule_max_ahead_days = schedule_max_ahead_days
        self.admission = admission
        self.broker = broker
        self.default_retry = default_retry
        self.catalog = CatalogCache(self._load_catalog)
        self.groups = CreateGroups(self.create_validated)
        # Shared with the state side when it runs in this process (``manager/start_publisher.py``).
        self.starts = starts or StartPublisher(sessions, broker)

    # --- create ----------------------------------------------------------------------------

    async def create(self, spec: NewObserver) -> CreatedObserver:
        """One observer, created together with the single creates that arrive meanwhile
        (``manager/create_groups.py``); validated alone, so its errors are its own."""
        with self.admission.admit(1, "creating"):
            return await self.groups.create((await self._validated([spec]))[0])

    async def create_many(self, specs: list[NewObserver]) -> list[CreatedObserver]:
        _refuse_duplicate_names(specs)
        with self.admission.admit(len(specs), "creating"):
            return await self.create_validated(await self._validated(specs))

    async def _validated(self, specs: list[NewObserver]) -> list[NewObserver]:
        many = len(specs) > 1

        now = datetime.now(UTC)
        for i, spec in enumerate(specs):
            if (far := schedule.too_far(spec.start_at, now, self.schedule_max_ahead_days)) is not None:
                raise Invalid(f"observers[{i}].{far}" if many else far)

        def validated(catalog: KindCatalog) -> list[NewObserver]:
            return [
                validate(spec, catalog, self.default_retry, f"observers[{i}]." if many else "")
                for i, spec in enumerate(specs)
            ]

        try:
            return validated(await self.catalog.get())
        except (Invalid, Unavailable):
            # The cached catalog may predate a service that was just born: ask again once.
            return validated(await self.catalog.get(fresh=True))

    async def create_validated(self, specs: list[NewObserver]) -> list[CreatedObserver]:
        """Create ``specs`` (already validated) all or nothing: ``Conflict`` if a name is
        taken (or repeated), ``NoCapacity`` if a pool cannot take them, ``Unavailable`` if
        the broker refuses."""
        policies: dict[tuple[tuple[str, Any], ...], RetryPolicy] = {}  # a bulk usually shares one

        def policy(retry: dict[str, Any] | None) -> RetryPolicy:
            key = tuple(sorted((retry or {}).items()))
            if key not in policies:
                policies[key] = RetryPolicy.model_validate(retry or {})
            return policies[key]

        starts = [build_start(uuid.uuid4(), s, policy(s.retry)) for s in specs]
        now = datetime.now(UTC)
        schedules = [schedule.new_schedule(s.start_at, s.stop_at, s.run_for_s, now) for s in specs]
        pinned = {start.observer_id for start, spec in zip(starts, specs, strict=True) if spec.rebalance is False}
        created_at = await self._insert(starts, schedules, pinned)
        rows = [created_row(s, p, created_at, s.observer_id in pinned) for s, p in zip(starts, schedules, strict=True)]
        # Scheduled rows have no start yet: the leader's scheduler publishes it when due.
        starts = [s for s, p in zip(starts, schedules, strict=True) if p.start_at is None]
        ids = [s.observer_id for s in starts]
        if not starts:
            return rows
        try:
            await self.starts.publish(starts)
        except BrokerUnavailable as e:
            # Some starts may have been published: found running, they are stopped, not adopted.
            # All of the request goes, Scheduled rows too: a create is all or nothing.
            every = [r.id for r in rows]
            await self._transaction("deleting the unpublished observers", observers.delete_unpublished, every)
            raise Unavailable(
                f"the message broker is unreachable or overloaded, nothing was created; retry later ({e})"
            ) from e
        try:
            await self._transaction("marking starts published", observers.mark_published, ids)
        except Exception as e:
            if not is_transient(e):
                raise
            # Rows committed and starts confirmed: the observers exist, and a 503 would make
            # the client create them again (409). The pending-start repair publishes the pending starts
            # again; the rules absorb the duplicates.
            logger.warning("%d start(s) published but still marked pending: %s", len(ids), describe(e))
        # The rows as inserted: nothing else can have changed them before their start was
        # confirmed, and reading 1,000 rows back cost more than the insert.
        return rows

    async def _load_catalog(self) -> KindCatalog:
        async with self.sessions() as session:
            return await KindCatalog.load(session)

    async def _insert(
        self, starts: list[StartObserver], schedules: list[NewSchedule], pinned: set[uuid.UUID]
    ) -> datetime:
        """Insert the rows (Created), their pending starts and their history in one round
        trip; returns their ``created_at``. Capacity is checked under a per-pool lock."""
        pools = Counter(s.pool for s in starts)

        async def transaction() -> datetime:
            async with self.sessions.begin() as session:
                for pool in sorted(pools):
                    await observers.lock_pool(session, pool)
                    await self._check_capacity(session, pool, pools[pool])
                created_at = await creates.insert_created(session, starts, schedules)
                if pinned:
                    await observers.pin(session, pinned)
                return created_at

        try:
            return await retry_lost_races(transaction, "create")
        except IntegrityError as e:
            taken = await self._live_names([s.name for s in starts])
            raise Conflict(
                f"observer name(s) already used by an observer that is not Deleted/Failed: {', '.join(taken)}"
                if taken
                else f"conflicting observer: {e.orig}"
            ) from e

    async def _transaction(
        self, what: str, statement: Callable[[AsyncSession, list[uuid.UUID]], Awaitable[None]], ids: list[uuid.UUID]
    ) -> None:
        """``statement`` on ``ids`` in a transaction of its own, run again if it loses a race."""

        async def transaction() -> None:
            async with self.sessions.begin() as session:
                await statement(session, ids)

        await retry_lost_races(transaction, what)

    async def _live_names(self, names: list[str]) -> list[str]:
        async with self.sessions() as session:
            return sorted(repr(n) for n in await observers.live_names(session, names))

    async def _check_capacity(self, session: AsyncSession, pool: str, wanted: int) -> None:
        total, used = await services.pool_capacity(session, pool)
        if not total:
            draining = await services.draining_in(session, pool)
            if draining:
                raise NoCapacity(
                    f"every live service of pool {pool!r} is being drained ({', '.join(draining)}): uncordon one "
                    "(POST /api/services/{id}/uncordon) or start another"
                )
            raise NoCapacity(f"no live observer service serves pool {pool!r}; start one or use another pool")
        if used + wanted > total:
            raise NoCapacity(
                f"pool {pool!r} is full: {used}/{total} workers busy, {wanted} more requested; "
                "stop observers or add services"
            )

    # --- restart ---------------------------------------------------------------------------

    async def restart(self, observer_id: uuid.UUID) -> Observer:
        """A Failed observer gets a fresh start message (a new life: attempts start over)."""
        async with self.sessions() as session:
            found = await session.get(Observer, observer_id)
            if found is None:
                raise NotFound(f"no observer with id {observer_id}")
            name = found.name

        async def transaction() -> tuple[StartObserver, datetime]:
            async with self.sessions.begin() as session:
                obs = await observers.lock_one(session, observer_id)
                if obs.status != ObserverStatus.FAILED:
                    raise Conflict(
                        f"observer {observer_id} is {obs.status.value}; only a Failed observer can be restarted"
                    )
                await observers.lock_pool(session, obs.pool)
                await self._check_capacity(session, obs.pool, 1)
                now = datetime.now(UTC)
                obs.status, obs.service_id, obs.attempts, obs.modified_at = ObserverStatus.CREATED, None, 0, now
                # Probation is kept: a restarted poison is isolated again as soon as it starts.
                obs.host_session_id = obs.awaiting_broker_since = None
                obs.life += 1  # a new life: stops of the old one must not eat its start
                # A new life runs for its run_for_s again; a stop_at already past would end it at once.
                if obs.run_for_s is not None:
                    obs.stop_at = now + timedelta(seconds=obs.run_for_s)
                elif obs.stop_at is not None and obs.stop_at <= now:
                    obs.stop_at = None
                session.add(PendingStart(observer_id=observer_id))
                await session.flush()
                await insert_events(session, [NewEvent(observer_id, EventType.RESTARTED, now, detail=obs.last_error)])
                return start_message(obs), now

        try:
            start, restarted_at = await retry_lost_races(transaction, "restart")
        except IntegrityError as e:
            raise Conflict(
                f"observer {observer_id} cannot be restarted: its name {name!r} is now used by another "
                "observer that is not Deleted/Failed"
            ) from e
        published = False
        try:
            await self.starts.publish([start])
            published = True
        except BrokerUnavailable as e:
            if await self._undo_restart(observer_id, restarted_at):
                raise Unavailable(
                    f"the message broker is unreachable, the observer stays Failed; retry later ({e})"
                ) from e
            # A report changed the row meanwhile (the start arrived although its confirm did
            # not, or a stop was requested): that is the truth now, and the restart stands.
            logger.warning("restart of %s: start not confirmed (%s), but the observer moved on", observer_id, e)
        async with self.sessions.begin() as session:
            if published:  # else its pending start stays for the pending-start repair, like after a crash
                await observers.mark_published(session, [observer_id])
            return await session.get_one(Observer, observer_id)

    async def _undo_restart(self, observer_id: uuid.UUID, restarted_at: datetime) -> bool:
        """Failed again after the restart's start could not be published: a compare-and-set,
        only if the row is still as the restart left it (a report may have moved it on
        meanwhile). Returns whether it was."""

        async def transaction() -> bool:
            async with self.sessions.begin() as session:
                return await observers.undo_restart(session, observer_id, restarted_at)

        return await retry_lost_races(transaction, "undoing a restart")

    # --- stop ------------------------------------------------------------------------------

    async def stop(self, observer_id: uuid.UUID) -> Observer:
        result = await self.stop_many([observer_id])
        if result.unknown:
            raise NotFound(f"no observer with id {observer_id}")
        async with self.sessions() as session:
            observer = await session.get_one(Observer, observer_id)
        if result.final:
            raise Conflict(f"observer {observer_id} is already {observer.status.value}; nothing to stop")
        return observer

    async def stop_many(self, observer_ids: list[uuid.UUID]) -> StopResult:
        wanted = sorted(set(observer_ids))
        with self.admission.admit(len(wanted), "stopping"):
            return await self._stop_many(wanted)

    async def _stop_many(self, wanted: list[uuid.UUID]) -> StopResult:
        if not self.broker.is_connected():
            # Like a create: refused before anything changes, so the client knows to retry.
            # (If the broker goes away after the rows changed, the re-stop loop broadcasts.)
            raise Unavailable("the message broker is unreachable, nothing was stopped; retry later")

        async def transaction() -> observers.Stopping:
            async with self.sessions.begin() as session:
                now = datetime.now(UTC)
                done = await observers.mark_stopping(session, wanted, now)
                events = [NewEvent(i, EventType.STOP_REQUESTED, now) for i in done.to_stop]
                events += [
                    NewEvent(i, EventType.CANCELLED, now, detail="stopped before its start_at") for i in done.cancelled
                ]
                await insert_events(session, events)
                return done

        done = await retry_lost_races(transaction, "stop")
        found = done.found
        for message in stop_messages(done.to_stop, "stop requested", lives=done.lives):
            try:
                await self.broker.publish_control(message)
            except BrokerUnavailable as e:
                # The rows say OnDeleting: the re-stop loop broadcasts again when the broker is back.
                logger.warning("%d stop(s) not broadcast yet: %s", len(message.observer_ids), e)
        return StopResult(
            stopping=[i for i, s in found.items() if s not in FINAL_STATUSES and s != ObserverStatus.SCHEDULED],
            final=[i for i, s in found.items() if s in FINAL_STATUSES],
            unknown=[i for i in wanted if i not in found],
            cancelled=done.cancelled,
        )

    # --- reschedule ------------------------------------------------------------------------

    async def reschedule(self, observer_id: uuid.UUID, start_at: datetime) -> Observer:
        """A Scheduled observer's new start time (a past one: it starts at the scheduler's
        next pass). ``Conflict`` once it is no longer Scheduled."""
        if (far := schedule.too_far(start_at, datetime.now(UTC), self.schedule_max_ahead_days)) is not None:
            raise Invalid(far)

        async def transaction() -> Observer:
            async with self.sessions.begin() as session:
                await schedule_rows.reschedule(session, observer_id, start_at, datetime.now(UTC))
                return await session.get_one(Observer, observer_id, populate_existing=True)

        return await retry_lost_races(transaction, "reschedule")

    # --- services --------------------------------------------------------------------------

    async def set_draining(self, service_id: uuid.UUID, draining: bool) -> tuple[Service, int]:
        """Drain a service (no new starts; the balancer hands its observers over) or let it
        take starts again; the service as it stands then."""
        async with self.sessions.begin() as session:
            await fleet_rows.set_draining(session, service_id, draining)
            if draining:  # say at once whether the others have room for all it runs
                fleet, _ = await fleet_rows.members(session, set())
                await fleet_rows.set_drain_notes(session, {service_id: drain_note(fleet, service_id)})
        async with self.sessions() as session:
            return await services.get_service(session, service_id)


def _refuse_duplicate_names(specs: list[NewObserver]) -> None:
    repeated = sorted(name for name, count in Counter(s.name for s in specs).items() if count > 1)
    if repeated:
        raise Invalid(f"observer names must be unique within a request; repeated: {', '.join(map(repr, repeated))}")
