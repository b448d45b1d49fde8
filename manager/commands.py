"""Operations that change observers: create and stop, one or many at a time.

Create = insert the rows (Created) with a ``pending_starts`` row each, publish their start
messages with confirms, then delete the pending rows. A crash between the two steps leaves
pending rows that the sweeper publishes again. A broker that refuses any start gives 503 and leaves no row (a
start that was confirmed meanwhile runs as an unknown observer and is stopped after
``ORCH_UNKNOWN_GRACE_S``). A bulk request is all-or-nothing.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import zlib
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db.models import (
    FINAL_STATUSES,
    LIVE_STATUSES,
    Observer,
    ObserverStatus,
    PendingStart,
    Service,
    ServiceStatus,
)
from manager.db.sql import id_in
from manager.errors import Conflict, Invalid, NotFound, Unavailable
from shared.errors import BrokerUnavailable
from shared.kinds import BUILTIN_KINDS
from shared.messages import StartObserver, stop_messages

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewObserver:
    name: str
    kind: str
    args: dict[str, Any]
    pool: str = "default"


@dataclass(frozen=True)
class StopResult:
    stopping: list[uuid.UUID]  # now (or already) OnDeleting
    final: list[uuid.UUID]  # already Deleted or Failed
    unknown: list[uuid.UUID]


class ObserverCommands:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], broker: BrokerLink) -> None:
        self.sessions = sessions
        self.broker = broker
        # Starts this process is publishing right now: the sweeper leaves them alone, however
        # slow the broker's confirms are.
        self.in_flight: set[uuid.UUID] = set()

    # --- create ----------------------------------------------------------------------------

    async def create(self, spec: NewObserver) -> Observer:
        return (await self.create_many([spec]))[0]

    async def create_many(self, specs: list[NewObserver]) -> list[Observer]:
        specs = await self._validated(specs)
        _refuse_duplicate_names(specs)
        starts = [
            StartObserver(observer_id=uuid.uuid4(), name=s.name, kind=s.kind, args=s.args, pool=s.pool) for s in specs
        ]
        ids = [s.observer_id for s in starts]
        await self._insert(
            [{"id": s.observer_id, "name": s.name, "kind": s.kind, "args": s.args, "pool": s.pool} for s in starts]
        )
        self.in_flight.update(ids)
        try:
            results = await asyncio.gather(*(self.broker.publish_start(s) for s in starts), return_exceptions=True)
        finally:
            self.in_flight.difference_update(ids)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            async with self.sessions.begin() as session:
                await session.execute(delete(Observer).where(Observer.id.in_(ids)))
            raise Unavailable(
                f"the message broker is unreachable, nothing was created; retry later ({failed[0]})"
            ) from failed[0]
        async with self.sessions.begin() as session:
            await session.execute(delete(PendingStart).where(PendingStart.observer_id.in_(ids)))
            by_id = {o.id: o for o in await session.scalars(select(Observer).where(Observer.id.in_(ids)))}
        return [by_id[i] for i in ids]

    async def _insert(self, rows: list[dict[str, Any]]) -> None:
        pools = Counter(r["pool"] for r in rows)
        try:
            async with self.sessions.begin() as session:
                for pool in sorted(pools):
                    # Serialise creates per pool so two requests cannot both take the last slot.
                    await session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": zlib.crc32(pool.encode())})
                    await self._check_capacity(session, pool, pools[pool])
                await session.execute(insert(Observer), [r | {"status": ObserverStatus.CREATED} for r in rows])
                await session.execute(insert(PendingStart), [{"observer_id": r["id"]} for r in rows])
        except IntegrityError as e:
            taken = await self._live_names([r["name"] for r in rows])
            raise Conflict(
                f"observer name(s) already used by an observer that is not Deleted/Failed: {', '.join(taken)}"
                if taken
                else f"conflicting observer: {e.orig}"
            ) from e

    async def _live_names(self, names: list[str]) -> list[str]:
        async with self.sessions() as session:
            rows = await session.scalars(
                select(Observer.name).where(Observer.name.in_(names), Observer.status.not_in(FINAL_STATUSES))
            )
            return sorted(repr(n) for n in rows)

    async def _validated(self, specs: list[NewObserver]) -> list[NewObserver]:
        known: set[str] | None = None
        validated = []
        for index, spec in enumerate(specs):
            where = f"observers[{index}]." if len(specs) > 1 else ""
            builtin = BUILTIN_KINDS.get(spec.kind)
            if builtin is not None:
                try:
                    args = builtin.parse_args(spec.args).model_dump(mode="json")
                except ValidationError as e:
                    problems = "; ".join(
                        f"{'.'.join(map(str, err['loc'])) or 'args'}: {err['msg']}" for err in e.errors()
                    )
                    raise Invalid(f"{where}args invalid for kind {spec.kind!r}: {problems}") from e
                validated.append(NewObserver(spec.name, spec.kind, args, spec.pool))
                continue
            known = known if known is not None else await self._announced_kinds()
            if spec.kind not in known:
                raise Invalid(
                    f"{where}kind: unknown observer kind {spec.kind!r}; known kinds: {', '.join(sorted(known))}"
                )
            validated.append(spec)
        return validated

    async def _announced_kinds(self) -> set[str]:
        async with self.sessions() as session:
            announced = await session.scalars(select(Service.kinds).where(Service.status == ServiceStatus.ALIVE))
            return set(BUILTIN_KINDS).union(*[set(k) for k in announced])

    async def _check_capacity(self, session: AsyncSession, pool: str, wanted: int) -> None:
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
        if (used or 0) + wanted > total:
            raise Unavailable(
                f"pool {pool!r} is full: {used}/{total} workers busy, {wanted} more requested; "
                "stop observers or add services"
            )

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
        async with self.sessions.begin() as session:
            # Lock in id order, like the state consumer, so the two never deadlock.
            found = dict(
                (
                    await session.execute(
                        select(Observer.id, Observer.status)
                        .where(id_in(Observer.id, wanted))
                        .order_by(Observer.id)
                        .with_for_update()
                    )
                ).all()
            )
            to_stop = [i for i, s in found.items() if s in (ObserverStatus.CREATED, ObserverStatus.PROCESSING)]
            if to_stop:
                await session.execute(
                    update(Observer)
                    .where(id_in(Observer.id, to_stop))
                    .values(status=ObserverStatus.ON_DELETING, modified_at=datetime.now(UTC))
                )
        for message in stop_messages(to_stop, "stop requested"):
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


def _refuse_duplicate_names(specs: list[NewObserver]) -> None:
    repeated = sorted(name for name, count in Counter(s.name for s in specs).items() if count > 1)
    if repeated:
        raise Invalid(f"observer names must be unique within a request; repeated: {', '.join(map(repr, repeated))}")
