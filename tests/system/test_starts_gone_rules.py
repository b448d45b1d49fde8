"""What the leader does with a ``StartsGone`` report (the state rules and the gone-start
repair in-process, on a real PostgreSQL).

A broker that lost its data took every start queue with it, so every service reports every
start it held as gone, in a new session, while the leader's rebuild has already released
every row and published a start for each. Taken again, a report of that kind put a second
copy of a start in the queue, and the observer ran on two services (CI on 4.0,
test_the_broker_rebuilt_from_the_database)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import cast

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db import observers
from manager.db.models import Observer, PendingStart
from manager.repairs.pending_starts import GoneStarts
from manager.start_publisher import StartPublisher
from manager.state.follow_ups import FollowUps
from manager.state.probation import ProbationPolicy
from manager.state.rules import StateRules
from shared.messages import ObserversStarted, ServiceBorn, StartsGone, StateMessage


async def _apply(rules: StateRules, sessions: async_sessionmaker[AsyncSession], *batch: StateMessage) -> None:
    """As the state consumer applies a batch. Until the transaction commits, no gone start is
    the repair's: its own transaction would not see the row pending, and would forget it (CI,
    test_consumer_cancel: 17 starts waited for the pending-start repair instead)."""
    follow_ups = FollowUps()
    async with sessions.begin() as session:
        await rules.preload(session, list(batch))
        for message in batch:
            follow_ups.add(await rules.apply(session, message, datetime.now(UTC)))
        await rules.flush(session)
        assert not rules.gone_starts
    rules.committed(follow_ups)


async def _pending(sessions: async_sessionmaker[AsyncSession]) -> set[uuid.UUID]:
    async with sessions() as session:
        return set(await session.scalars(select(PendingStart.observer_id)))


async def test_only_starts_the_reporter_still_holds_are_published_again(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    rules = StateRules(ProbationPolicy(after_service_deaths=3, window_s=600.0, budget=1.0))
    service, session_id = uuid.uuid4(), uuid.uuid4()
    held, released = [uuid.uuid4() for _ in range(3)], [uuid.uuid4() for _ in range(3)]
    async with sessions.begin() as session:
        for oid in held + released:
            await session.execute(
                text("INSERT INTO observers (id, name, kind, status) VALUES (:oid, :name, 'ticker', 'Created')"),
                {"oid": oid, "name": f"o-{oid}"},
            )
    born = ServiceBorn(
        service_id=service,
        name="a",
        workers_count=20,
        pools=["default"],
        kinds=["ticker"],
        host="h",
        pid=1,
        version="t",
    )
    await _apply(
        rules, sessions, born, ObserversStarted(service_id=service, session_id=session_id, observer_ids=released)
    )
    async with sessions.begin() as session:  # the broker lost its data: the rebuild's first step
        assert await observers.release_unlocked(session, datetime.now(UTC), "rebuilt") == len(released)
    await _apply(rules, sessions, ObserversStarted(service_id=service, session_id=session_id, observer_ids=held))

    await _apply(
        rules,
        sessions,
        StartsGone(service_id=service, session_id=session_id, pools=["default"], observer_ids=held + released),
    )

    assert await _pending(sessions) == set(held)
    assert rules.gone_starts == set(held)
    async with sessions() as session:
        rows = {o.id: o for o in await session.scalars(select(Observer))}
    assert all(rows[oid].status == "Created" and rows[oid].service_id is None for oid in held + released)

    # The rebuild published the held ones too before the gone-start repair's pass: nothing
    # is pending, so the repair publishes nothing (it has no broker to publish to here).
    async with sessions.begin() as session:
        await observers.mark_published(session, held)
    await GoneStarts(sessions, StartPublisher(sessions, cast(BrokerLink, None)), rules.gone_starts).run()
    assert rules.gone_starts == set()
