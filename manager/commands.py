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
import zlib
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic_core
from sqlalchemy import Executable, delete, func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.admission import Admission
from manager.broker import BrokerLink
from manager.create_groups import CreateGroups
from manager.db.counts import live_in_pool_query
from manager.db.errors import describe, is_transient
from manager.db.models import (
    FINAL_STATUSES,
    EventType,
    Observer,
    ObserverEvent,
    ObserverStatus,
    PendingStart,
    Service,
    ServiceStatus,
)
from manager.db.retry import retry_lost_races
from manager.db.sql import id_in, lock_by_ids
from manager.errors import Conflict, Invalid, NoCapacity, NotFound, Unavailable
from manager.history import NewEvent, insert_events
from manager.kinds import CatalogCache, KindCatalog, NewObserver, validate
from manager.starts import build_start, start_message
from shared.errors import BrokerUnavailable
from shared.messages import RetryPolicy, StartObserver, stop_messages

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StopResult:
    stopping: list[uuid.UUID]  # now (or already) OnDeleting
    final: list[uuid.UUID]  # already Deleted or Failed
    unknown: list[uuid.UUID]


class ObserverCommands:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        broker: BrokerLink,
        default_retry: RetryPolicy,
        admission: Admission,
    ) -> None:
        self.sessions = sessions
        self.admission = admission
        self.broker = broker
        self.default_retry = default_retry
        self.catalog = CatalogCache(self._load_catalog)
        self.groups = CreateGroups(self.create_validated)
        # Starts this process is publishing right now: the pending-start repair leaves them alone, however
        # slow the broker's confirms are.
        self.in_flight: set[uuid.UUID] = set()

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
        ids = [s.observer_id for s in starts]
        created_at = await self._insert(starts)
        self.in_flight.update(ids)
        try:
            await self.broker.publish_starts(starts)
        except BrokerUnavailable as e:
            await self._execute(
                "deleting the unpublished observers",
                delete(Observer).where(id_in(Observer.id, ids)),
                # After the rows: a report about one may have written an event until then.
                delete(ObserverEvent).where(id_in(ObserverEvent.observer_id, ids)),
                # Some starts may have been published: found running, they are stopped, not adopted.
                text(
                    "INSERT INTO abandoned_observers (observer_id) SELECT unnest(CAST(:ids AS uuid[])) "
                    "ON CONFLICT DO NOTHING"
                ).bindparams(ids=ids),
            )
            raise Unavailable(
                f"the message broker is unreachable or overloaded, nothing was created; retry later ({e})"
            ) from e
        finally:
            self.in_flight.difference_update(ids)
        try:
            await self._execute(
                "marking starts published", delete(PendingStart).where(id_in(PendingStart.observer_id, ids))
            )
        except Exception as e:
            if not is_transient(e):
                raise
            # Rows committed and starts confirmed: the observers exist, and a 503 would make
            # the client create them again (409). The pending-start repair publishes the pending starts
            # again; the rules absorb the duplicates.
            logger.warning("%d start(s) published but still marked pending: %s", len(ids), describe(e))
        # The rows as inserted: nothing else can have changed them before their start was
        # confirmed, and reading 1,000 rows back cost more than the insert.
        return [_created_row(s, created_at) for s in starts]

    async def _load_catalog(self) -> KindCatalog:
        async with self.sessions() as session:
            return await KindCatalog.load(session)

    async def _insert(self, starts: list[StartObserver]) -> datetime:
        """Insert the rows (Created), their pending starts and their history in one round
        trip; returns their ``created_at``. Capacity is checked under a per-pool lock."""
        pools = Counter(s.pool for s in starts)

        async def transaction() -> datetime:
            async with self.sessions.begin() as session:
                for pool in sorted(pools):
                    # Serialise creates per pool so two requests cannot both take the last slot.
                    await session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": zlib.crc32(pool.encode())})
                    await self._check_capacity(session, pool, pools[pool])
                created_at: datetime = (await session.execute(_INSERT_CREATED, _insert_params(starts))).scalar_one()
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

    async def _execute(self, what: str, *statements: Executable) -> None:
        """``statements`` in one transaction, run again if it loses a race."""

        async def transaction() -> None:
            async with self.sessions.begin() as session:
                for statement in statements:
                    await session.execute(statement)

        await retry_lost_races(transaction, what)

    async def _live_names(self, names: list[str]) -> list[str]:
        async with self.sessions() as session:
            rows = await session.scalars(
                select(Observer.name).where(Observer.name.in_(names), Observer.status.not_in(FINAL_STATUSES))
            )
            return sorted(repr(n) for n in rows)

    async def _check_capacity(self, session: AsyncSession, pool: str, wanted: int) -> None:
        # One round trip: creates of a pool wait for each other (the advisory lock) while
        # this runs, so every round trip here is paid by every queued create.
        total_workers = (
            select(func.coalesce(func.sum(Service.workers_count), 0))
            .where(Service.status == ServiceStatus.ALIVE, Service.pools.contains([pool]))
            .scalar_subquery()
        )
        total, used = (await session.execute(select(total_workers, live_in_pool_query(pool)))).one()
        if not total:
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
                obs = await session.get_one(Observer, observer_id, with_for_update={"key_share": True})
                if obs.status != ObserverStatus.FAILED:
                    raise Conflict(
                        f"observer {observer_id} is {obs.status.value}; only a Failed observer can be restarted"
                    )
                await session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": zlib.crc32(obs.pool.encode())})
                await self._check_capacity(session, obs.pool, 1)
                now = datetime.now(UTC)
                obs.status, obs.service_id, obs.attempts, obs.modified_at = ObserverStatus.CREATED, None, 0, now
                # Probation is kept: a restarted poison is isolated again as soon as it starts.
                obs.host_session_id = None
                obs.life += 1  # a new life: stops of the old one must not eat its start
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
        self.in_flight.add(observer_id)
        published = False
        try:
            await self.broker.publish_starts([start])
            published = True
        except BrokerUnavailable as e:
            if await self._undo_restart(observer_id, restarted_at):
                raise Unavailable(
                    f"the message broker is unreachable, the observer stays Failed; retry later ({e})"
                ) from e
            # A report changed the row meanwhile (the start arrived although its confirm did
            # not, or a stop was requested): that is the truth now, and the restart stands.
            logger.warning("restart of %s: start not confirmed (%s), but the observer moved on", observer_id, e)
        finally:
            self.in_flight.discard(observer_id)
        async with self.sessions.begin() as session:
            if published:  # else its pending start stays for the pending-start repair, like after a crash
                await session.execute(delete(PendingStart).where(PendingStart.observer_id == observer_id))
            return await session.get_one(Observer, observer_id)

    async def _undo_restart(self, observer_id: uuid.UUID, restarted_at: datetime) -> bool:
        """Failed again after the restart's start could not be published: a compare-and-set,
        only if the row is still as the restart left it (a report may have moved it on
        meanwhile). Returns whether it was."""

        async def transaction() -> bool:
            async with self.sessions.begin() as session:
                undone = (
                    await session.execute(
                        update(Observer)
                        .where(
                            Observer.id == observer_id,
                            Observer.status == ObserverStatus.CREATED,
                            Observer.service_id.is_(None),
                            Observer.modified_at == restarted_at,
                        )
                        .values(status=ObserverStatus.FAILED, modified_at=datetime.now(UTC))
                        .returning(Observer.id)
                    )
                ).first()
                if undone is not None:
                    await session.execute(delete(PendingStart).where(PendingStart.observer_id == observer_id))
                return undone is not None

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

        async def transaction() -> tuple[dict[uuid.UUID, ObserverStatus], list[uuid.UUID], list[int]]:
            async with self.sessions.begin() as session:
                # Lock in id order, like the state consumer, so the two never deadlock; by a
                # semi-join with the ids, whose rechecks of rows changed meanwhile cost little.
                rows = (await session.execute(lock_by_ids((Observer.id, Observer.status, Observer.life), wanted))).all()
                found = {i: s for i, s, _ in rows}
                stoppable = (ObserverStatus.CREATED, ObserverStatus.PROCESSING)
                to_stop = [i for i, s, _ in rows if s in stoppable]
                lives = [life for _, s, life in rows if s in stoppable]
                if to_stop:
                    now = datetime.now(UTC)
                    await session.execute(
                        update(Observer)
                        .where(id_in(Observer.id, to_stop))
                        .values(status=ObserverStatus.ON_DELETING, modified_at=now)
                    )
                    await insert_events(session, [NewEvent(i, EventType.STOP_REQUESTED, now) for i in to_stop])
                return found, to_stop, lives

        found, to_stop, lives = await retry_lost_races(transaction, "stop")
        for message in stop_messages(to_stop, "stop requested", lives=lives):
            try:
                await self.broker.publish_control(message)
            except BrokerUnavailable as e:
                # The rows say OnDeleting: the re-stop loop broadcasts again when the broker is back.
                logger.warning("%d stop(s) not broadcast yet: %s", len(message.observer_ids), e)
        return StopResult(
            stopping=[i for i, s in found.items() if s not in FINAL_STATUSES],
            final=[i for i, s in found.items() if s in FINAL_STATUSES],
            unknown=[i for i in wanted if i not in found],
        )


# Observers, their pending starts and their "created" events, from one set of arrays. The
# ORM's executemany of the same rows was a quarter of the manager's time on bulk creates.
_INSERT_CREATED = text(
    """
    WITH new AS (
        INSERT INTO observers (id, name, kind, args, pool, retry, isolation, memory_limit_mb, status)
        SELECT id, name, kind, args, pool, retry, isolation, memory_limit_mb, 'Created'
        FROM unnest(
            CAST(:ids AS uuid[]), CAST(:names AS text[]), CAST(:kinds AS text[]), CAST(:args AS jsonb[]),
            CAST(:pools AS text[]), CAST(:retries AS jsonb[]), CAST(:isolations AS text[]),
            CAST(:memory_limits AS float8[])
        ) AS v(id, name, kind, args, pool, retry, isolation, memory_limit_mb)
        RETURNING id, created_at
    ), pending AS (
        INSERT INTO pending_starts (observer_id, created_at) SELECT id, created_at FROM new
    ), history AS (
        INSERT INTO observer_events (observer_id, at, event) SELECT id, created_at, :created_event FROM new
    )
    SELECT now()
    """
)


def _insert_params(starts: list[StartObserver]) -> dict[str, Any]:
    return {
        "ids": [s.observer_id for s in starts],
        "names": [s.name for s in starts],
        "kinds": [s.kind for s in starts],
        "args": [pydantic_core.to_json(s.args).decode() for s in starts],
        "pools": [s.pool for s in starts],
        "retries": [s.retry.model_dump_json() for s in starts],
        "isolations": [s.isolation for s in starts],
        "memory_limits": [s.memory_limit_mb for s in starts],
        "created_event": EventType.CREATED.value,
    }


@dataclass(frozen=True, slots=True)
class CreatedObserver:
    """A row as ``create_many`` inserted it (the fields the API shows of an observer)."""

    id: uuid.UUID
    name: str
    kind: str
    args: dict[str, Any]
    pool: str
    retry: RetryPolicy
    isolation: str | None
    memory_limit_mb: float | None
    created_at: datetime
    status: ObserverStatus = ObserverStatus.CREATED
    service_id: uuid.UUID | None = None
    attempts: int = 0
    last_error: str | None = None
    probation_since: datetime | None = None
    probation_clean_since: datetime | None = None

    @property
    def modified_at(self) -> datetime:
        return self.created_at


def _created_row(start: StartObserver, created_at: datetime) -> CreatedObserver:
    return CreatedObserver(
        start.observer_id,
        start.name,
        start.kind,
        start.args,
        start.pool,
        start.retry,
        start.isolation,
        start.memory_limit_mb,
        created_at,
    )


def _refuse_duplicate_names(specs: list[NewObserver]) -> None:
    repeated = sorted(name for name, count in Counter(s.name for s in specs).items() if count > 1)
    if repeated:
        raise Invalid(f"observer names must be unique within a request; repeated: {', '.join(map(repr, repeated))}")
