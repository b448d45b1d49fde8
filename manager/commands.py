"""Operations that change observers: create and stop.

Create = insert the row (Created), publish its start message with a confirm, then mark it
enqueued. A crash between the two steps leaves a row with ``enqueued_at`` NULL that the
sweeper publishes again; a broker that is down at create time gives 503 and no row.
"""

from __future__ import annotations

import logging
import uuid
import zlib
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db.models import LIVE_STATUSES, Observer, ObserverStatus, Service, ServiceStatus
from manager.errors import Conflict, Invalid, NotFound, Unavailable
from shared.errors import BrokerUnavailable
from shared.kinds import BUILTIN_KINDS
from shared.messages import StartObserver, StopObserver

logger = logging.getLogger(__name__)


class ObserverCommands:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], broker: BrokerLink) -> None:
        self.sessions = sessions
        self.broker = broker

    async def create(self, *, name: str, kind: str, args: dict[str, Any], pool: str) -> Observer:
        args = await self._validated_args(kind, args)
        observer_id = uuid.uuid4()
        try:
            async with self.sessions.begin() as session:
                # Serialise creates per pool so two requests cannot both take the last slot.
                await session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": zlib.crc32(pool.encode())})
                await self._check_capacity(session, pool)
                session.add(
                    Observer(id=observer_id, name=name, kind=kind, args=args, pool=pool, status=ObserverStatus.CREATED)
                )
        except IntegrityError as e:
            raise Conflict(f"an observer named {name!r} already exists and is not Deleted/Failed") from e
        start = StartObserver(observer_id=observer_id, name=name, kind=kind, args=args, pool=pool)
        try:
            await self.broker.publish_start(start)
        except BrokerUnavailable as e:
            async with self.sessions.begin() as session:
                await session.execute(delete(Observer).where(Observer.id == observer_id))
            raise Unavailable(f"the message broker is unreachable, nothing was created; retry later ({e})") from e
        async with self.sessions.begin() as session:
            await session.execute(
                update(Observer).where(Observer.id == observer_id).values(enqueued_at=datetime.now(UTC))
            )
            observer = await session.get_one(Observer, observer_id)
        return observer

    async def stop(self, observer_id: uuid.UUID) -> Observer:
        async with self.sessions.begin() as session:
            observer = await session.get(Observer, observer_id, with_for_update=True)
            if observer is None:
                raise NotFound(f"no observer with id {observer_id}")
            if observer.status in (ObserverStatus.DELETED, ObserverStatus.FAILED):
                raise Conflict(f"observer {observer_id} is already {observer.status.value}; nothing to stop")
            if observer.status == ObserverStatus.ON_DELETING:
                return observer
            observer.status = ObserverStatus.ON_DELETING
            observer.modified_at = datetime.now(UTC)
        try:
            await self.broker.publish_control(StopObserver(observer_id=observer_id, reason="stop requested"))
        except BrokerUnavailable as e:
            # The row says OnDeleting: the re-stop loop broadcasts again when the broker is back.
            logger.warning("stop of %s not broadcast yet: %s", observer_id, e)
        return observer

    async def _validated_args(self, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        builtin = BUILTIN_KINDS.get(kind)
        if builtin is not None:
            try:
                parsed: dict[str, Any] = builtin.parse_args(args).model_dump(mode="json")
                return parsed
            except ValidationError as e:
                problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'args'}: {err['msg']}" for err in e.errors())
                raise Invalid(f"invalid args for kind {kind!r}: {problems}") from e
        async with self.sessions() as session:
            announced = await session.scalars(select(Service.kinds).where(Service.status == ServiceStatus.ALIVE))
            known = set(BUILTIN_KINDS).union(*[set(k) for k in announced])
        if kind not in known:
            raise Invalid(f"unknown observer kind {kind!r}; known kinds: {', '.join(sorted(known))}")
        return args

    async def _check_capacity(self, session: AsyncSession, pool: str) -> None:
        total = await session.scalar(
            select(func.coalesce(func.sum(Service.workers_count), 0)).where(
                Service.status == ServiceStatus.ALIVE, Service.pools.contains([pool])
            )
        )
        used = await session.scalar(
            select(func.count()).where(Observer.pool == pool, Observer.status.in_(LIVE_STATUSES))
        )
        if not total:
            raise Unavailable(f"no live observer service serves pool {pool!r}; start one or use another pool")
        if (used or 0) >= total:
            raise Unavailable(f"pool {pool!r} is full ({used}/{total} workers busy); stop an observer or add services")
