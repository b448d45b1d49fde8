"""The rows one transaction of the state consumer works on: observers and services.

Rules read and change plain ``Row`` objects; ``flush`` writes every changed row back with a
single ``UPDATE ... FROM unnest(...)``, a few microseconds per row, where the ORM's unit of
work per changed observer capped a catching-up manager's rate (figures: docs/design.md,
"Where the time goes").

Rows are loaded ``FOR NO KEY UPDATE`` in id order (the order every writer of ``observers``
uses, so the consumer and the API never deadlock) and stay locked until the transaction ends.
Every writer of observer rows takes that mode, never ``FOR UPDATE``: it excludes the other
writers but not a reader of the key. Recording events (a service's death writes one per observer
it ran) locks no observer row at all (no foreign key: migration 0009), so it never waits for,
nor deadlocks with, a transaction that changes those rows.
Pending changes are flushed before any query that filters on a column rules may change
(``load``), unless the caller judges the cached rows in memory (``matching``); queries on
ids alone need no flush.

Services are read as plain ``ServiceRow`` objects too, and ``ServiceRows`` is the only
writer of ``services`` on the state side (the consumer, and the liveness judgment that marks
one lost); its writes are immediate (see there why).

Its statements stay here rather than in ``manager/db``, by design: they are one unit of work
(rows loaded locked, cached, changed in memory, written back at once), and keeping them
together keeps the state side's lock order in one place. The other writers' statements are
in ``manager/db`` (``db/observers.py`` takes the same order), and the rules pass conditions
here with their in-memory twin (``matching``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.events import NewEvent, insert_events
from manager.db.models import EventType, Observer, ObserverStatus, Service, ServiceStatus
from manager.db.service_observers import on_service
from manager.db.sql import factor, id_in, lock_by_ids
from shared.messages import ServiceBorn

_COLUMNS = (
    Observer.id,
    Observer.status,
    Observer.service_id,
    Observer.attempts,
    Observer.last_error,
    Observer.modified_at,
    Observer.host_session_id,
    Observer.probation_since,
    Observer.probation_clean_since,
    Observer.awaiting_broker_since,
)

# Rows are sent as id, attempts and the number of the rest of their state among the batch's
# distinct ones (``manager.db.sql.factor``): the rows a batch moves share a service, a session
# and an instant.
_WRITE = text(
    """
    UPDATE observers AS o
    SET status = s.status::observer_status, service_id = s.service_id, attempts = r.attempts,
        last_error = s.last_error, modified_at = s.modified_at, host_session_id = s.host_session_id,
        probation_since = s.probation_since, probation_clean_since = s.probation_clean_since,
        awaiting_broker_since = s.awaiting_broker_since
    FROM unnest(CAST(:ids AS uuid[]), CAST(:attempts AS integer[]), CAST(:keys AS integer[])) AS r(id, attempts, k)
    JOIN unnest(
        CAST(:statuses AS text[]), CAST(:service_ids AS uuid[]), CAST(:errors AS text[]),
        CAST(:modified AS timestamptz[]), CAST(:sessions AS uuid[]), CAST(:probation AS timestamptz[]),
        CAST(:clean AS timestamptz[]), CAST(:awaiting AS timestamptz[])
    ) WITH ORDINALITY AS s(status, service_id, last_error, modified_at, host_session_id, probation_since,
                           probation_clean_since, awaiting_broker_since, k) USING (k)
    WHERE o.id = r.id
    """
)


@dataclass(eq=False, slots=True)
class Row:
    id: uuid.UUID
    status: ObserverStatus
    service_id: uuid.UUID | None
    attempts: int
    last_error: str | None
    modified_at: datetime
    host_session_id: uuid.UUID | None = None  # the service's broker session holding its start
    probation_since: datetime | None = None
    probation_clean_since: datetime | None = None
    # Created on no service, its start held by the broker for an ended session: since when.
    awaiting_broker_since: datetime | None = None
    _saved: tuple[Any, ...] = field(default=(), repr=False)

    def state(self) -> tuple[Any, ...]:
        return (
            self.status,
            self.service_id,
            self.attempts,
            self.last_error,
            self.modified_at,
            self.host_session_id,
            self.probation_since,
            self.probation_clean_since,
            self.awaiting(),
        )

    def set_service(self, service_id: uuid.UUID | None, session_id: uuid.UUID | None = None) -> None:
        """Set (or clear) the service running it and the session in which that holds the start."""
        self.service_id, self.host_session_id = service_id, session_id

    def awaiting(self) -> datetime | None:
        """``awaiting_broker_since`` as written: it ends with anything that makes the row more
        than Created on no service (a start, a stop, a move)."""
        if self.status != ObserverStatus.CREATED or self.service_id is not None:
            return None
        return self.awaiting_broker_since

    def changed(self) -> bool:
        return self.state() != self._saved


class ObserverRows:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session
        self._rows: dict[uuid.UUID, Row] = {}
        self._absent: set[uuid.UUID] = set()
        self._events: list[NewEvent] = []

    def event(
        self,
        observer_id: uuid.UUID,
        event: EventType,
        at: datetime,
        service_id: uuid.UUID | None = None,
        from_service_id: uuid.UUID | None = None,
        detail: str | None = None,
        from_session_id: uuid.UUID | None = None,
    ) -> None:
        """Record a history event; written by ``flush`` with the rows."""
        self._events.append(NewEvent(observer_id, event, at, service_id, from_service_id, detail, from_session_id))

    async def load(self, where: ColumnElement[bool]) -> list[Row]:
        """Lock and return the rows matching ``where`` as stored after writing every pending
        change (cached ones keep their state). For queries on columns rules change; a caller
        that can judge the cached rows itself uses :meth:`matching`, which writes nothing.
        One statement: its callers (probations due to end) name no id array, whose rechecks
        are what :meth:`matching` avoids."""
        await self.flush()
        return [self._rows.get(values[0]) or self._remember(values) for values in await self._locked(where)]

    async def matching(self, where: ColumnElement[bool], judge: Callable[[Row], bool]) -> list[Row]:
        """Lock and return the rows that match as this transaction sees them, without
        flushing first: ``where`` (the query) finds the rows not cached here, whose stored
        state is the transaction's; ``judge`` (the same condition, in Python) judges the
        cached ones, whose stored state may be stale. Flushing would write every changed row
        before the query and again when it changed once more, as when a catch-up's batch
        releases each goodbye's rows and moves them to their new services (figures:
        docs/design.md, "Where the time goes").

        The rows ``where`` finds are read first, unlocked, then locked by id
        (``lock_by_ids``), and ``judge`` decides again on what the lock returned: a row
        another transaction changed in between is returned as it is now, and only if it
        still matches, as a single locking statement would recheck it, without that
        statement's cost (``manager/db/sql.py``)."""
        rows = [row for row in self._rows.values() if judge(row)]
        found = [oid for oid in await self.session.scalars(select(Observer.id).where(where)) if oid not in self._rows]
        rows += [row for row in await self._locked_ids(found) if judge(row)]
        return rows

    async def _locked(self, where: ColumnElement[bool]) -> Sequence[Any]:
        """The stored rows matching ``where``, locked in id order (see the module's docstring)."""
        result = await self.session.execute(
            select(*_COLUMNS).where(where).order_by(Observer.id).with_for_update(key_share=True)
        )
        return result.all()

    async def _locked_ids(self, ids: Collection[uuid.UUID]) -> list[Row]:
        """The rows with these ids (none of them cached), locked in id order, as stored now."""
        if not ids:
            return []
        return [self._remember(values) for values in (await self.session.execute(lock_by_ids(_COLUMNS, ids))).all()]

    async def held_by(self, service_id: uuid.UUID) -> list[Row]:
        """Lock and return the rows ``service_id`` runs (Processing or OnDeleting) as this
        transaction sees them (:meth:`matching`)."""
        held = (ObserverStatus.PROCESSING, ObserverStatus.ON_DELETING)
        return await self.matching(
            on_service(service_id) & Observer.status.in_(held),
            lambda row: row.service_id == service_id and row.status in held,
        )

    def _remember(self, values: Sequence[Any]) -> Row:
        """A row just read (and locked), cached with its stored state as the saved one."""
        row = Row(*values)
        row._saved = row.state()
        self._rows[row.id] = row
        return row

    async def preload(self, ids: set[uuid.UUID]) -> None:
        """Lock and cache the rows with these ids (those not cached yet)."""
        missing = ids - self._rows.keys()
        found = {row.id for row in await self._locked_ids(missing)}
        self._absent |= missing - found

    async def get(self, observer_id: uuid.UUID) -> Row | None:
        row = self._rows.get(observer_id)
        if row is not None or observer_id in self._absent:
            return row
        rows = await self._locked_ids([observer_id])
        if not rows:
            self._absent.add(observer_id)
        return rows[0] if rows else None

    def services(self) -> set[uuid.UUID]:
        """The services the cached rows name."""
        return {row.service_id for row in self._rows.values() if row.service_id is not None}

    async def flush(self) -> None:
        events, self._events = self._events, []
        await insert_events(self.session, events)
        changed = [row for row in self._rows.values() if row.changed()]
        if not changed:
            return
        keys, (statuses, service_ids, errors, modified, sessions, probation, clean, awaiting) = factor(changed, _shared)
        await self.session.execute(
            _WRITE,
            {
                "ids": [r.id for r in changed],
                "attempts": [r.attempts for r in changed],
                "keys": keys,
                "statuses": statuses,
                "service_ids": service_ids,
                "errors": errors,
                "modified": modified,
                "sessions": sessions,
                "probation": probation,
                "clean": clean,
                "awaiting": awaiting,
            },
        )
        for row in changed:
            row._saved = row.state()


def _shared(row: Row) -> tuple[Any, ...]:
    """A row's state but its attempts (which differ from row to row), as ``_WRITE`` takes it."""
    return (
        row.status.value,
        row.service_id,
        row.last_error,
        row.modified_at,
        row.host_session_id,
        row.probation_since,
        row.probation_clean_since,
        row.awaiting(),
    )


@dataclass(frozen=True, slots=True)
class ServiceRow:
    """What the rules read of a service. Frozen: a write replaces the cached row, so a row
    read before (``_born``'s namesakes) keeps the status it had."""

    id: uuid.UUID
    name: str
    status: ServiceStatus
    last_heartbeat_at: datetime


_SERVICE_COLUMNS = (Service.id, Service.name, Service.status, Service.last_heartbeat_at)


class ServiceRows:
    """The services one transaction reads, cached (absent ones too: a batch of reports from a
    service the manager does not know would otherwise query for it once per report), and
    the one place the consumer writes them.

    Unlike observer rows they are read without a lock and every write is one immediate
    compare-and-set or upsert, not a change flushed later: a touch's outcome says at once
    whether to ask the service to introduce itself; a born row is in the cache before
    any observer row names it as its service; and a deletion locks its row at once, so a concurrent
    ``judge_heartbeats`` waits for it and finds it deleted rather than lost. A batch
    writes a few services (one heartbeat each every few seconds), not thousands, so one
    statement each costs little. Each write puts the row as written into the cache.
    """

    def __init__(self, session: AsyncSession) -> None:
        self.session = session
        self._rows: dict[uuid.UUID, ServiceRow | None] = {}

    async def preload(self, ids: set[uuid.UUID]) -> None:
        missing = ids - self._rows.keys()
        if missing:
            self._rows.update(dict.fromkeys(missing))
            result = await self.session.execute(select(*_SERVICE_COLUMNS).where(id_in(Service.id, missing)))
            self._keep(result.all())

    async def get(self, service_id: uuid.UUID) -> ServiceRow | None:
        """The service's row (any status), or None if the manager does not know it."""
        if service_id not in self._rows:
            result = await self.session.execute(select(*_SERVICE_COLUMNS).where(Service.id == service_id))
            self._rows[service_id] = None
            self._keep(result.all())
        return self._rows[service_id]

    async def namesakes(self, name: str, service_id: uuid.UUID) -> list[ServiceRow]:
        """Lock, in id order, the other instances named ``name`` that are not deleted."""
        result = await self.session.execute(
            select(*_SERVICE_COLUMNS)
            .where(Service.name == name, Service.id != service_id, Service.status != ServiceStatus.DELETED)
            .order_by(Service.id)
            .with_for_update()
        )
        return self._keep(result.all())

    async def touch(
        self,
        service_id: uuid.UUID,
        now: datetime,
        running: int,
        session_id: uuid.UUID | None,
        loop_lag_ms: float | None = None,
        refused: str | None = None,
    ) -> bool:
        """Record a sign of life from ``session_id`` (None: a service that does not say); a
        lost service that speaks again is alive. False if the service is unknown or deleted.
        A heartbeat also gives ``loop_lag_ms`` and ``refused`` (what the broker refuses it)."""
        values: dict[str, object] = {
            "status": ServiceStatus.ALIVE,
            "last_heartbeat_at": now,
            "modified_at": now,
            "running": running,
            "session_id": session_id,
        }
        if loop_lag_ms is not None:
            values["loop_lag_ms"] = loop_lag_ms
            values["refused"] = refused
        result = await self.session.execute(
            update(Service)
            .where(Service.id == service_id, Service.status != ServiceStatus.DELETED)
            .values(values)
            .returning(*_SERVICE_COLUMNS)
            .execution_options(synchronize_session=False)  # no Service objects in the session
        )
        if self._keep(result.all()):
            return True
        cached = self._rows.get(service_id)
        if cached is not None and cached.status != ServiceStatus.DELETED:
            del self._rows[service_id]  # deleted since it was read: read it again when asked
        return False

    async def delete(self, service_id: uuid.UUID, now: datetime, running: int | None = None) -> None:
        """Mark the instance deleted; ``running`` is what it said it runs (a goodbye: 0), a
        replaced instance keeps its last count."""
        values: dict[str, object] = {"status": ServiceStatus.DELETED, "is_deleted": True, "modified_at": now}
        if running is not None:
            values["running"] = running
        result = await self.session.execute(
            update(Service)
            .where(Service.id == service_id)
            .values(values)
            .returning(*_SERVICE_COLUMNS)
            .execution_options(synchronize_session=False)
        )
        self._rows[service_id] = None
        self._keep(result.all())

    async def mark_lost(self, service_id: uuid.UUID, silent_since: datetime, now: datetime) -> bool:
        """Mark an alive service lost unless it spoke after ``silent_since`` (compare-and-set);
        False if it did, or is not alive."""
        result = await self.session.execute(
            update(Service)
            .where(
                Service.id == service_id,
                Service.status == ServiceStatus.ALIVE,
                Service.last_heartbeat_at <= silent_since,
            )
            .values(status=ServiceStatus.LOST, modified_at=now)
            .returning(*_SERVICE_COLUMNS)
            .execution_options(synchronize_session=False)
        )
        return bool(self._keep(result.all()))

    async def born(self, m: ServiceBorn, now: datetime) -> None:
        """Insert the service, or bring its row up to date (alive again if it was deleted:
        born again under a name of its own after a name clash)."""
        values = {
            "name": m.name,
            "workers_count": m.workers_count,
            "process_slots": m.process_slots,
            "pools": m.pools,
            "kinds": m.kinds,
            "host": m.host,
            "pid": m.pid,
            "version": m.version,
            "kind_infos": [k.model_dump(mode="json") for k in m.kind_infos],
            "modified_at": now,
            "last_heartbeat_at": now,
            "status": ServiceStatus.ALIVE,
            "is_deleted": False,
        }
        stmt = insert(Service).values(id=m.service_id, **values)
        await self.session.execute(stmt.on_conflict_do_update(index_elements=[Service.id], set_=values))
        self._rows[m.service_id] = ServiceRow(m.service_id, m.name, ServiceStatus.ALIVE, now)

    def _keep(self, results: Sequence[Any]) -> list[ServiceRow]:
        rows = [ServiceRow(*values) for values in results]
        self._rows.update((row.id, row) for row in rows)
        return rows
