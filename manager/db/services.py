"""The statements about service rows that the API, the commands, the kind catalog and the
repairs run; the state consumer's own writes are ``ServiceRows`` in ``manager/state/rows.py``.
And ``stats``, the one statement behind ``GET /api/stats``."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, cast

from sqlalchemy import JSON, BigInteger, CursorResult, String, case, column, delete, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.counts import READ_SQL, live_in_pool_query
from manager.db.digests import held_per_service
from manager.db.leader import HOLDER_SQL
from manager.db.models import HOLDING_STATUSES, LIVE_STATUSES, ObserverStatus, Service, ServiceStatus
from manager.errors import NotFound


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
    return [(name, refused) for name, refused in result.all() if refused is not None]


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


async def silent_since(
    session: AsyncSession, heard_before: datetime
) -> list[tuple[uuid.UUID, str, datetime, uuid.UUID | None]]:
    """(id, name, last heartbeat, broker session) of the alive services not heard of since
    ``heard_before`` (the liveness repair asks the broker about them)."""
    result = await session.execute(
        select(Service.id, Service.name, Service.last_heartbeat_at, Service.session_id).where(
            Service.status == ServiceStatus.ALIVE, Service.last_heartbeat_at < heard_before
        )
    )
    return list(result.all())


async def pool_capacity(session: AsyncSession, pool: str) -> tuple[int, int]:
    """(workers of the alive services that serve ``pool`` and are not being drained, live
    observers in it), in one round trip: creates of a pool wait for each other while this runs."""
    total_workers = (
        select(func.coalesce(func.sum(Service.workers_count), 0))
        .where(Service.status == ServiceStatus.ALIVE, Service.pools.contains([pool]), Service.draining.is_(False))
        .scalar_subquery()
    )
    total, used = (await session.execute(select(total_workers, live_in_pool_query(pool)))).one()
    return int(total), int(used)


async def draining_in(session: AsyncSession, pool: str) -> list[str]:
    """The names of the alive services of ``pool`` that are being drained."""
    result = await session.execute(
        select(Service.name)
        .where(Service.status == ServiceStatus.ALIVE, Service.pools.contains([pool]), Service.draining.is_(True))
        .order_by(Service.name)
    )
    return list(result.scalars())


async def alive_offers(session: AsyncSession) -> list[tuple[list[str], list[dict[str, Any]]]]:
    """(pools, kinds announced) of every alive service."""
    rows = await session.execute(select(Service.pools, Service.kind_infos).where(Service.status == ServiceStatus.ALIVE))
    return [(pools, infos) for pools, infos in rows.all()]


# Everything ``GET /api/stats`` reads, in one statement: each round trip waits for the API's
# event loop and PostgreSQL in turn (figures: docs/bench-history.md).
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
            WHERE probation_since IS NOT NULL AND status::text = ANY(:live)) AS probation,
        (SELECT count(*) FROM observers WHERE probation_since IS NOT NULL AND status = 'Processing'
            AND probation_clean_since IS NULL) AS paused,
        -- the partial index on awaiting_broker_since: few wait at once (migration 0018)
        (SELECT count(*) FROM observers WHERE awaiting_broker_since IS NOT NULL AND status = 'Created'
            AND service_id IS NULL) AS awaiting_broker,
        ({HOLDER_SQL}) AS leader
    """
).columns(
    column("counts", JSON),
    column("alive", JSON),
    column("services", JSON),
    column("probation", BigInteger),
    column("paused", BigInteger),
    column("awaiting_broker", BigInteger),
    column("leader", String),
)


async def stats(session: AsyncSession) -> dict[str, Any]:
    row = (await session.execute(_STATS, {"live": [s.value for s in LIVE_STATUSES]})).one()
    by_status = {s.value: 0 for s in ObserverStatus}
    by_kind: dict[str, dict[str, int]] = {}
    used: dict[str, int] = {}
    for kind, pool, status, n in row.counts:
        by_status[status] += n
        per_kind = by_kind.setdefault(kind, {})
        per_kind[status] = per_kind.get(status, 0) + n
        if ObserverStatus(status) in HOLDING_STATUSES:  # a Scheduled one's worker is reserved
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
        "paused": row.paused,
        "awaiting_broker": row.awaiting_broker,
        "state_applied_by": row.leader,
    }


async def gone_sessions(session: AsyncSession, before: datetime) -> list[tuple[uuid.UUID, list[str]]]:
    """The last broker session and the pools of each service ``forget_gone`` would delete."""
    result = await session.execute(
        select(Service.session_id, Service.pools).where(
            Service.status != ServiceStatus.ALIVE, Service.modified_at < before, Service.session_id.is_not(None)
        )
    )
    return [(sid, list(pools)) for sid, pools in result.all() if sid is not None]


async def forget_gone(session: AsyncSession, before: datetime) -> int:
    """Delete the services not alive since before ``before``; how many."""
    result = await session.execute(
        delete(Service).where(Service.status != ServiceStatus.ALIVE, Service.modified_at < before)
    )
    return cast("CursorResult[Any]", result).rowcount
