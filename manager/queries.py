"""Read-only queries behind the API: observers (keyset pages), services, stats."""

from __future__ import annotations

import base64
import binascii
import enum
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, case, column, func, select, text, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.counts import READ_SQL
from manager.db.hosts import hosted_on
from manager.db.models import LIVE_STATUSES, Observer, ObserverStatus, Service, ServiceStatus
from manager.errors import Invalid, NotFound
from manager.state.digest import held_per_service


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
    text = f"{key.isoformat() if isinstance(key, datetime) else key}|{observer_id}"
    return base64.urlsafe_b64encode(text.encode()).decode()


def decode_cursor(cursor: str, sort: Sort = Sort.CREATED) -> tuple[datetime | int, uuid.UUID]:
    try:
        key, oid = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        return (datetime.fromisoformat(key) if sort == Sort.CREATED else int(key)), uuid.UUID(oid)
    except (ValueError, binascii.Error, UnicodeDecodeError) as e:
        raise Invalid(
            "cursor is not valid: pass the next_cursor of a previous page unchanged, with the same sort"
        ) from e


def _like_pattern(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


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
        query = query.where(hosted_on(flt.service_id))
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


async def list_services(session: AsyncSession, include_deleted: bool = True) -> list[tuple[Service, int]]:
    counts = held_per_service()
    order = case((Service.status == ServiceStatus.ALIVE, 0), (Service.status == ServiceStatus.LOST, 1), else_=2)
    query = select(Service, func.coalesce(counts.c.running, 0)).outerjoin(counts, counts.c.service_id == Service.id)
    if not include_deleted:
        query = query.where(Service.status != ServiceStatus.DELETED)
    query = query.order_by(order, Service.name, Service.created_at.desc()).limit(1000)
    return [(svc, int(n)) for svc, n in (await session.execute(query)).all()]


async def refused_services(session: AsyncSession, limit: int = 5) -> list[tuple[str, str]]:
    """(name, what the broker refuses it) of alive services that said they are refused."""
    result = await session.execute(
        select(Service.name, Service.refused)
        .where(Service.status == ServiceStatus.ALIVE, Service.refused.is_not(None))
        .order_by(Service.name)
        .limit(limit)
    )
    return [(name, refused) for name, refused in result.tuples() if refused is not None]


async def get_service(session: AsyncSession, service_id: uuid.UUID) -> tuple[Service, int]:
    counts = held_per_service()
    row = (
        await session.execute(
            select(Service, func.coalesce(counts.c.running, 0))
            .outerjoin(counts, counts.c.service_id == Service.id)
            .where(Service.id == service_id)
        )
    ).first()
    if row is None:
        raise NotFound(f"no service with id {service_id}")
    return row[0], int(row[1])


# Everything ``GET /api/stats`` reads, in one statement: four queries were four round trips,
# each waiting for the API's event loop and PostgreSQL in turn, and the stats page had the
# highest p99 of the three ``make bench`` times while 100,000 tickers ran (scale).
_STATS = text(
    f"""
    SELECT
        (SELECT coalesce(json_agg(json_build_array(kind, pool, status, n)), '[]') FROM ({READ_SQL}) AS c) AS counts,
        (SELECT coalesce(json_agg(json_build_array(pools, workers_count)), '[]')
            FROM services WHERE status = 'alive') AS alive,
        (SELECT coalesce(json_object_agg(status, n), '{{}}')
            FROM (SELECT status::text AS status, count(*) AS n FROM services GROUP BY 1) AS s) AS services,
        -- the partial index on probation_since keeps this cheap: few observers are on probation
        (SELECT count(*) FROM observers
            WHERE probation_since IS NOT NULL AND status::text = ANY(:live)) AS probation
    """
).columns(column("counts", JSON), column("alive", JSON), column("services", JSON), column("probation", BigInteger))


async def stats(session: AsyncSession) -> dict[str, Any]:
    row = (await session.execute(_STATS, {"live": [s.value for s in LIVE_STATUSES]})).one()
    by_status = {s.value: 0 for s in ObserverStatus}
    by_kind: dict[str, dict[str, int]] = {}
    used: dict[str, int] = {}
    for kind, pool, status, n in row.counts:
        by_status[status] += n
        per_kind = by_kind.setdefault(kind, {})
        per_kind[status] = per_kind.get(status, 0) + n
        if ObserverStatus(status) in LIVE_STATUSES:
            used[pool] = used.get(pool, 0) + n
    total: dict[str, int] = {}
    for pools, workers in row.alive:
        for pool in pools:
            total[pool] = total.get(pool, 0) + workers
    capacity = {
        pool: {
            "total": total.get(pool, 0),
            "used": used.get(pool, 0),
            "free": max(0, total.get(pool, 0) - used.get(pool, 0)),
        }
        for pool in sorted(set(total) | set(used))
    }
    services = {s.value: 0 for s in ServiceStatus} | {status: int(n) for status, n in row.services.items()}
    return {
        "observers": by_status,
        "services": services,
        "capacity": capacity,
        "kinds": dict(sorted(by_kind.items())),
        "probation": row.probation,
    }
