"""The statements about observer rows that the API's commands and reads, the adoption rules
and the repairs run (the broker's rebuild among them); the state consumer's own unit of work
is ``manager/state/rows.py``.

Lock order: a statement that locks observer rows locks them ``FOR NO KEY UPDATE`` in id
order (``lock_by_ids``, or ``ORDER BY id ... SKIP LOCKED``), the order of every writer of
``observers`` (``manager/state/rows.py`` says why), so no two writers deadlock.
"""

from __future__ import annotations

import base64
import binascii
import enum
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, exists, func, or_, select, text, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.models import (
    FINAL_STATUSES,
    AbandonedObserver,
    EventType,
    Observer,
    ObserverEvent,
    ObserverStatus,
    PendingStart,
    Service,
)
from manager.db.service_observers import on_service
from manager.db.sql import id_in, lock_by_ids
from manager.errors import Invalid, NotFound

S = ObserverStatus


# --- the API's reads ------------------------------------------------------------------------


@dataclass(frozen=True)
class ObserverFilter:
    status: ObserverStatus | None = None
    kind: str | None = None
    pool: str | None = None
    service_id: uuid.UUID | None = None
    name: str | None = None
    q: str | None = None  # a substring of the name, any case


class Sort(enum.StrEnum):
    CREATED = "created"  # oldest first
    ATTEMPTS = "attempts"  # most attempts first (seed 001: "the jobs with the most attempts")


def encode_cursor(key: datetime | int, observer_id: uuid.UUID) -> str:
    raw = f"{key.isoformat() if isinstance(key, datetime) else key}|{observer_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_cursor(cursor: str, sort: Sort = Sort.CREATED) -> tuple[datetime | int, uuid.UUID]:
    try:
        key, oid = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        return (datetime.fromisoformat(key) if sort == Sort.CREATED else int(key)), uuid.UUID(oid)
    except (ValueError, binascii.Error, UnicodeDecodeError) as e:
        raise Invalid(
            "cursor is not valid: pass the next_cursor of a previous page unchanged, with the same sort"
        ) from e


def _like_pattern(part: str) -> str:
    return "%" + part.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


async def list_observers(
    session: AsyncSession, flt: ObserverFilter, limit: int, cursor: str | None, sort: Sort = Sort.CREATED
) -> tuple[list[tuple[Observer, str | None]], str | None]:
    query = select(Observer, Service.name).outerjoin(Service, Service.id == Observer.service_id)
    if flt.status is not None:
        query = query.where(Observer.status == flt.status)
    if flt.kind is not None:
        query = query.where(Observer.kind == flt.kind)
    if flt.pool is not None:
        query = query.where(Observer.pool == flt.pool)
    if flt.service_id is not None:
        query = query.where(on_service(flt.service_id))
    if flt.name is not None:
        query = query.where(Observer.name == flt.name)
    if flt.q:
        query = query.where(Observer.name.ilike(_like_pattern(flt.q)))
    # Keyset pages: (created_at, id) ascending, or (attempts descending, id ascending).
    key = Observer.created_at if sort == Sort.CREATED else -Observer.attempts
    if cursor is not None:
        after, after_id = decode_cursor(cursor, sort)
        bound = -after if isinstance(after, int) else after
        query = query.where(tuple_(key, Observer.id) > tuple_(bound, after_id))
    query = query.order_by(key, Observer.id).limit(limit + 1)
    rows: list[tuple[Observer, str | None]] = [(obs, svc) for obs, svc in (await session.execute(query)).all()]
    next_cursor = None
    if len(rows) > limit:
        rows = rows[:limit]
        last = rows[-1][0]
        next_cursor = encode_cursor(last.created_at if sort == Sort.CREATED else last.attempts, last.id)
    return rows, next_cursor


async def get_observer(session: AsyncSession, observer_id: uuid.UUID) -> tuple[Observer, str | None]:
    row = (
        await session.execute(
            select(Observer, Service.name)
            .outerjoin(Service, Service.id == Observer.service_id)
            .where(Observer.id == observer_id)
        )
    ).first()
    if row is None:
        raise NotFound(f"no observer with id {observer_id}")
    return row[0], row[1]


# --- creates (the rows of a create: ``manager/db/creates.py``) ---------------------------------


async def pin(session: AsyncSession, ids: set[uuid.UUID]) -> None:
    """Mark new rows as never moved to even the load (``"rebalance": false``)."""
    await session.execute(update(Observer).where(id_in(Observer.id, sorted(ids))).values(pinned=True))


async def insert_adopted(session: AsyncSession, rows: list[dict[str, object]]) -> set[uuid.UUID]:
    """Insert the rows of adopted observers; a create of the same name or id that committed
    meanwhile wins. Returns the ids inserted."""
    inserted = await session.scalars(insert(Observer).values(rows).on_conflict_do_nothing().returning(Observer.id))
    return set(inserted)


async def lock_pool(session: AsyncSession, pool: str) -> None:
    """Serialise the creates and restarts of a pool until the transaction ends, so that two
    cannot both take its last free worker."""
    await session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": zlib.crc32(pool.encode())})


async def live_names(session: AsyncSession, names: Sequence[str]) -> list[str]:
    """Which of ``names`` a live (not Deleted or Failed) observer uses."""
    rows = await session.scalars(
        select(Observer.name).where(Observer.name.in_(names), Observer.status.not_in(FINAL_STATUSES))
    )
    return list(rows)


async def delete_unpublished(session: AsyncSession, ids: Sequence[uuid.UUID]) -> None:
    """Undo a create whose starts the broker refused: the rows and their history go, and the
    ids are remembered as abandoned (a start published anyway is stopped, not adopted)."""
    await session.execute(delete(Observer).where(id_in(Observer.id, ids)))
    # After the rows: a report about one may have written an event until then.
    await session.execute(delete(ObserverEvent).where(id_in(ObserverEvent.observer_id, ids)))
    await session.execute(
        text(
            "INSERT INTO abandoned_observers (observer_id) SELECT unnest(CAST(:ids AS uuid[])) ON CONFLICT DO NOTHING"
        ).bindparams(ids=list(ids))
    )


async def mark_pending(session: AsyncSession, ids: Sequence[uuid.UUID], now: datetime) -> None:
    """These rows' starts are about to be published again: pending until the broker confirmed
    them, so that a crash in between leaves them to the pending-start repair (invariant 6)."""
    await session.execute(
        text(
            "INSERT INTO pending_starts (observer_id, created_at) "
            "SELECT unnest(CAST(:ids AS uuid[])), :now ON CONFLICT DO NOTHING"
        ),
        {"ids": list(ids), "now": now},
    )


async def pending_without_service(session: AsyncSession, ids: Sequence[uuid.UUID]) -> list[Observer]:
    """The rows among ``ids`` still Created with no service and a start still pending."""
    query = (
        select(Observer)
        .join(PendingStart, PendingStart.observer_id == Observer.id)
        .where(id_in(Observer.id, ids), Observer.status == ObserverStatus.CREATED, Observer.service_id.is_(None))
    )
    return list(await session.scalars(query))


async def mark_published(session: AsyncSession, ids: Sequence[uuid.UUID]) -> None:
    """The broker confirmed these starts: they are no longer pending."""
    await session.execute(delete(PendingStart).where(id_in(PendingStart.observer_id, ids)))


async def unconfirmed_starts(session: AsyncSession, older_than: datetime, limit: int) -> list[Observer]:
    """Observers whose start is still pending since before ``older_than`` (a crash between
    commit and confirm)."""
    return list(
        await session.scalars(
            select(Observer)
            .join(PendingStart, PendingStart.observer_id == Observer.id)
            .where(PendingStart.created_at < older_than)
            .limit(limit)
        )
    )


# --- restarts --------------------------------------------------------------------------------


async def lock_one(session: AsyncSession, observer_id: uuid.UUID) -> Observer:
    """The row, locked until the transaction ends (``NoResultFound`` if there is none)."""
    return await session.get_one(Observer, observer_id, with_for_update={"key_share": True})


async def undo_restart(session: AsyncSession, observer_id: uuid.UUID, restarted_at: datetime) -> bool:
    """Failed again, if the row is still as a restart left it at ``restarted_at`` (a report
    may have moved it on): a compare-and-set. Returns whether it was."""
    undone = (
        await session.execute(
            update(Observer)
            .where(
                Observer.id == observer_id,
                Observer.status == S.CREATED,
                Observer.service_id.is_(None),
                Observer.modified_at == restarted_at,
            )
            .values(status=S.FAILED, modified_at=datetime.now(UTC))
            .returning(Observer.id)
        )
    ).first()
    if undone is not None:
        await session.execute(delete(PendingStart).where(PendingStart.observer_id == observer_id))
    return undone is not None


# --- stops -----------------------------------------------------------------------------------

STOPPABLE = (S.CREATED, S.PROCESSING)


@dataclass(frozen=True)
class Stopping:
    """What ``mark_stopping`` found and did."""

    found: dict[uuid.UUID, ObserverStatus]  # the status each found row had
    to_stop: list[uuid.UUID]  # now OnDeleting: their stops are to be published
    lives: list[int]  # of to_stop
    cancelled: list[uuid.UUID]  # were Scheduled: now Deleted, never started, nothing to publish


async def mark_stopping(session: AsyncSession, ids: Sequence[uuid.UUID], now: datetime) -> Stopping:
    """Created and Processing rows among ``ids`` become OnDeleting, Scheduled ones Deleted
    (no start was published for them). The caller records the events."""
    # By a semi-join with the ids, whose rechecks of rows changed meanwhile cost little.
    rows = (await session.execute(lock_by_ids((Observer.id, Observer.status, Observer.life), ids))).all()
    to_stop = [i for i, s, _ in rows if s in STOPPABLE]
    cancelled = [i for i, s, _ in rows if s == S.SCHEDULED]
    if to_stop:
        await session.execute(
            update(Observer)
            .where(id_in(Observer.id, to_stop))
            .values(status=S.ON_DELETING, modified_at=now, stop_requested_at=now)
        )
    if cancelled:
        await session.execute(
            update(Observer).where(id_in(Observer.id, cancelled)).values(status=S.DELETED, modified_at=now)
        )
    return Stopping({i: s for i, s, _ in rows}, to_stop, [life for _, s, life in rows if s in STOPPABLE], cancelled)


async def touch_stale_stops(session: AsyncSession, now: datetime, older_than: timedelta) -> list[tuple[uuid.UUID, int]]:
    """(id, life) of rows OnDeleting and unchanged for ``older_than``, their ``modified_at``
    set to ``now`` (so each is re-stopped once per period). Rows another writer holds are
    skipped, never waited for: waiting in another lock order than the state consumer's
    deadlocked the two."""
    rows = (
        await session.execute(
            select(Observer.id, Observer.life)
            .where(Observer.status == S.ON_DELETING, Observer.modified_at < now - older_than)
            .order_by(Observer.id)
            .limit(10_000)
            .with_for_update(skip_locked=True, key_share=True)
        )
    ).all()
    ids = [i for i, _ in rows]
    if ids:
        await session.execute(update(Observer).where(id_in(Observer.id, ids)).values(modified_at=now))
    return [(i, life) for i, life in rows]


# --- lookups by id ---------------------------------------------------------------------------


async def existing_ids(session: AsyncSession, ids: Sequence[uuid.UUID] | set[uuid.UUID]) -> set[uuid.UUID]:
    """Which of ``ids`` have a row."""
    return set(await session.scalars(select(Observer.id).where(id_in(Observer.id, ids))))


async def count_existing(session: AsyncSession, ids: set[uuid.UUID]) -> int:
    """How many of ``ids`` have a row (cheaper than listing them when all do)."""
    return int(await session.scalar(select(func.count()).where(id_in(Observer.id, ids))) or 0)


async def abandoned_ids(session: AsyncSession, ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Which of ``ids`` a create answered 503 for (``delete_unpublished``)."""
    return set(
        await session.scalars(select(AbandonedObserver.observer_id).where(id_in(AbandonedObserver.observer_id, ids)))
    )


async def forget_abandoned(session: AsyncSession, before: datetime) -> None:
    """Forget the abandoned creates (``delete_unpublished``) older than ``before``."""
    await session.execute(delete(AbandonedObserver).where(AbandonedObserver.at < before))


async def live_owners(session: AsyncSession, names: set[str]) -> dict[str, uuid.UUID]:
    """Name -> id of the live observers that use any of ``names``."""
    live = Observer.status.not_in(FINAL_STATUSES)
    rows = await session.execute(select(Observer.name, Observer.id).where(Observer.name.in_(names), live))
    return {name: oid for name, oid in rows.all()}


# --- waiting for a start that may be in no queue (the lost-start repair) -----------------------


def waiting_for_a_start(unchanged_since: datetime, held_since: datetime) -> Any:
    """Rows with no service and no pending start that wait for their start to be taken: Created
    ones unchanged since ``unchanged_since`` (and, if the broker holds their start for an
    ended session, marked so before ``held_since``), and every OnDeleting one (re-stops touch
    its ``modified_at``: the repair judges those by its own memory)."""
    return (
        Observer.service_id.is_(None)
        & ~exists().where(PendingStart.observer_id == Observer.id)  # the pending-start repair's
        & or_(
            (Observer.status == S.CREATED)
            & (Observer.modified_at < unchanged_since)
            & or_(Observer.awaiting_broker_since.is_(None), Observer.awaiting_broker_since < held_since),
            Observer.status == S.ON_DELETING,
        )
    )


async def waiting_pools(
    session: AsyncSession, unchanged_since: datetime, held_since: datetime, limit: int
) -> list[tuple[uuid.UUID, str]]:
    """(id, pool) of rows ``waiting_for_a_start``."""
    query = select(Observer.id, Observer.pool).where(waiting_for_a_start(unchanged_since, held_since)).limit(limit)
    return [(oid, pool) for oid, pool in (await session.execute(query)).all()]


async def still_waiting(
    session: AsyncSession, ids: Sequence[uuid.UUID], unchanged_since: datetime, held_since: datetime
) -> list[Observer]:
    """The rows among ``ids`` that still wait for a start."""
    waiting = waiting_for_a_start(unchanged_since, held_since)
    return list(await session.scalars(select(Observer).where(id_in(Observer.id, ids) & waiting)))


# --- the broker rebuilt from the database (``manager/repairs/rebuild.py``) ----------------------

# Rows another writer holds are skipped, never waited for: the state consumer locks each
# report's rows in id order, but a batch's rows are not in one id order overall, so waiting
# while holding others deadlocks the two (docs/design.md, invariant 15; figures:
# docs/bench-history.md, "2026-11-26: the slow machine"). The release loop ends when no row
# matches: both statements must use this one predicate.
_HELD = "status = 'Processing' OR (status = 'OnDeleting' AND (service_id IS NOT NULL OR host_session_id IS NOT NULL))"
_RELEASE = text(
    f"""
    WITH released AS (
        UPDATE observers AS o
        SET status = CASE WHEN o.status = 'Processing' THEN 'Created'::observer_status ELSE o.status END,
            service_id = NULL, host_session_id = NULL, awaiting_broker_since = NULL, modified_at = :now
        FROM (SELECT id, service_id FROM observers WHERE {_HELD}
              ORDER BY id FOR NO KEY UPDATE SKIP LOCKED) AS old
        WHERE o.id = old.id
        RETURNING o.id, old.service_id AS from_service
    )
    INSERT INTO observer_events (observer_id, at, event, from_service_id, detail)
    SELECT id, :now, :event, from_service, :detail FROM released
    """
)
_ANY_HELD = text(f"SELECT EXISTS (SELECT 1 FROM observers WHERE {_HELD})")


async def release_unlocked(session: AsyncSession, now: datetime, detail: str) -> int:
    """Every row on a service that no other writer holds loses its service (Processing → Created,
    OnDeleting keeps its status), with a ``released`` event; returns how many."""
    result = await session.execute(_RELEASE, {"now": now, "event": EventType.RELEASED.value, "detail": detail})
    return cast("CursorResult[Any]", result).rowcount


async def any_on_a_service(session: AsyncSession) -> bool:
    """Whether any row is still on a service (``release_unlocked`` skipped it)."""
    return bool(await session.scalar(_ANY_HELD))


async def needing_a_start(session: AsyncSession, after: uuid.UUID | None, limit: int) -> list[Observer]:
    """Up to ``limit`` Created and OnDeleting rows, in id order after ``after``."""
    query = select(Observer).where(Observer.status.in_((S.CREATED, S.ON_DELETING)))
    if after is not None:
        query = query.where(Observer.id > after)
    return list(await session.scalars(query.order_by(Observer.id).limit(limit)))
