"""Reports applied in one transaction see each other's effects (the state rules in-process, on a
real PostgreSQL): a goodbye releases what its service started earlier in the same batch, and
leaves alone what moved away from it earlier in that batch, though neither was written yet; an
inventory judges the rows its batch changed as changed, and nothing is written twice."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.db.models import Observer, ObserverEvent
from manager.db.service_observers import on_service
from manager.state.probation import ProbationPolicy
from manager.state.rules import StateRules
from shared.messages import ObserversStarted, ServiceInventory, ServiceStopped, StateMessage


async def _service(session: AsyncSession, name: str, status: str) -> uuid.UUID:
    sid = uuid.uuid4()
    await session.execute(
        text(
            "INSERT INTO services (id, name, workers_count, pools, status) "
            "VALUES (:sid, :name, 5, '[\"default\"]', CAST(:status AS service_status))"
        ),
        {"sid": sid, "name": name, "status": status},
    )
    return sid


async def _running_on(session: AsyncSession, name: str, service_id: uuid.UUID) -> uuid.UUID:
    oid = uuid.uuid4()
    await session.execute(
        text(
            "INSERT INTO observers (id, name, kind, status, service_id) "
            "VALUES (:oid, :name, 'ticker', 'Processing', :service_id)"
        ),
        {"oid": oid, "name": name, "service_id": service_id},
    )
    return oid


# Counted as a difference within the transaction: the view may still hold the counts of the
# connection's earlier transactions (PostgreSQL 15 reports them once flushed, at most every second).
_UPDATES = text("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'observers'")


async def _apply(sessions: async_sessionmaker[AsyncSession], batch: list[StateMessage]) -> tuple[int, int]:
    """Apply ``batch`` in one transaction as the consumer does; the observer row updates it
    made (counting a row written twice twice), and how many of them were in place (HOT)."""
    rules = StateRules(ProbationPolicy(0, 60.0))
    async with sessions.begin() as session:
        before = (await session.execute(_UPDATES)).one()
        await rules.preload(session, batch)
        now = datetime.now(UTC)
        for message in batch:
            await rules.apply(session, message, now)
        await rules.flush(session)
        after = (await session.execute(_UPDATES)).one()
    return after[0] - before[0], after[1] - before[1]


async def test_a_goodbye_judges_the_rows_its_own_batch_changed_by_their_new_services(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions.begin() as session:
        leaving = await _service(session, "leaving", "alive")  # says goodbye in the batch
        lost = await _service(session, "lost", "lost")  # says goodbye in the batch too
        dead = await _service(session, "dead", "deleted")
        taker = await _service(session, "taker", "alive")
        moved_onto_leaving = await _running_on(session, "a", dead)
        moved_off_lost = await _running_on(session, "b", lost)
        stored_on_leaving = await _running_on(session, "c", leaving)

    batch: list[StateMessage] = [
        ObserversStarted(observer_ids=[moved_onto_leaving], service_id=leaving, redelivered=True),
        ObserversStarted(observer_ids=[moved_off_lost], service_id=taker, redelivered=True),
        ServiceStopped(service_id=leaving),
        ServiceStopped(service_id=lost),
    ]
    await _apply(sessions, batch)

    async with sessions() as session:
        rows = {
            o.id: (o.status.value, o.service_id)
            for o in await session.scalars(
                select(Observer).where(Observer.id.in_([moved_onto_leaving, moved_off_lost, stored_on_leaving]))
            )
        }
        released_events = select(ObserverEvent.observer_id).where(ObserverEvent.event == "released")
        released = set(await session.scalars(released_events))
    # Started on ``leaving`` in this batch, then released by its goodbye: not left on a gone service.
    assert rows[moved_onto_leaving] == ("Created", None)
    # Moved to ``taker`` in this batch: the goodbye of its old service must not take it back.
    assert rows[moved_off_lost] == ("Processing", taker)
    # Stored as running on ``leaving``: released.
    assert rows[stored_on_leaving] == ("Created", None)
    assert released == {moved_onto_leaving, stored_on_leaving}


async def test_an_inventory_judges_the_rows_its_batch_changed_and_each_row_is_written_once(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """A fleet restart while the manager was down: its backlog holds the old services'
    goodbyes, the new ones' inventories (sent when their sessions open) and their starts. An
    inventory used to write every change pending before it and the starts wrote the same
    rows again (make bench, catch-up)."""
    async with sessions.begin() as session:
        old = await _service(session, "old", "alive")
        new = await _service(session, "new", "alive")
        kept = await _running_on(session, "kept", old)
        gone = await _running_on(session, "gone", old)
    on_new = uuid.uuid4()  # the new service's broker session

    batch: list[StateMessage] = [
        ServiceStopped(service_id=old),
        ServiceInventory(service_id=new, observer_ids=[], session_id=on_new),  # at its session's start
        ObserversStarted(observer_ids=[kept], service_id=new, redelivered=True, session_id=on_new),
        ObserversStarted(observer_ids=[gone], service_id=new, redelivered=True, session_id=on_new),
        # Later it runs only ``kept``: ``gone`` is on it in this batch alone, in memory.
        ServiceInventory(service_id=new, observer_ids=[kept], session_id=on_new),
    ]
    updates, _ = await _apply(sessions, batch)

    async with sessions() as session:
        rows = {
            o.id: (o.status.value, o.service_id, o.host_session_id)
            for o in await session.scalars(select(Observer).where(Observer.id.in_([kept, gone])))
        }
    assert rows[kept] == ("Processing", new, on_new)
    assert rows[gone] == ("Created", None, None)  # not running where the batch put it: released
    assert updates == 2, f"{updates} row updates for 2 observers: a row was written more than once"


async def test_a_batch_writes_each_row_and_event_as_its_rules_left_them_and_in_order(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """Rows and events are written with what they share sent once (``manager.db.sql.factor``):
    each row still gets its own attempts and state, and each observer's events keep the order
    they happened in."""
    async with sessions.begin() as session:
        old = await _service(session, "old", "alive")
        new = await _service(session, "new", "alive")
        often, once, left = [await _running_on(session, name, old) for name in ("often", "once", "left")]
        await session.execute(text("UPDATE observers SET attempts = 5 WHERE id = :oid"), {"oid": often})
    on_new = uuid.uuid4()

    batch: list[StateMessage] = [
        ServiceStopped(service_id=old),
        ObserversStarted(observer_ids=[often], service_id=new, redelivered=True, session_id=on_new),
        ObserversStarted(observer_ids=[once], service_id=new, redelivered=True, session_id=on_new),
    ]
    await _apply(sessions, batch)

    async with sessions() as session:
        rows = {
            o.id: (o.status.value, o.service_id, o.host_session_id, o.attempts)
            for o in await session.scalars(select(Observer).where(Observer.id.in_([often, once, left])))
        }
        history = (
            await session.execute(
                select(ObserverEvent.observer_id, ObserverEvent.event, ObserverEvent.service_id)
                .where(ObserverEvent.observer_id.in_([often, once, left]))
                .order_by(ObserverEvent.id)
            )
        ).all()
    assert rows == {
        often: ("Processing", new, on_new, 5),  # a move carries on its attempt (migration 0011)
        once: ("Processing", new, on_new, 1),
        left: ("Created", None, None, 0),
    }
    events = {oid: [(event, sid) for o, event, sid in history if o == oid] for oid in (often, once, left)}
    assert events == {
        often: [("released", None), ("started", new)],
        once: [("released", None), ("started", new)],
        left: [("released", None)],
    }


async def test_a_failover_updates_the_moved_rows_in_place_and_keeps_their_attempts(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """A move changes no indexed column of ``observers`` (migration 0011): PostgreSQL updates
    every moved row in place (a HOT update, no new index entry), and the row keeps its
    attempts, its service found through ``observer_hosts``. An index on the service or the attempts,
    or a move counted as an attempt, fails this."""
    async with sessions.begin() as session:
        services = [await _service(session, name, "alive") for name in ("a", "b", "c", "new")]
        # Interleaved, as a fleet's creates are: a third of each page moves.
        rows = [(await _running_on(session, f"o{i}", services[i % 3]), services[i % 3]) for i in range(60)]
        await session.execute(text("UPDATE observers SET attempts = 2"))
    moving = [oid for oid, service in rows if service == services[0]]
    on_new = uuid.uuid4()
    batch: list[StateMessage] = [
        ObserversStarted(service_id=services[3], session_id=on_new, redelivered=True, observer_ids=moving)
    ]
    updated, in_place = await _apply(sessions, batch)
    assert (updated, in_place) == (len(moving), len(moving))

    async with sessions() as session:
        moved = (
            await session.execute(
                select(Observer.id, Observer.attempts, Observer.host_session_id).where(on_service(services[3]))
            )
        ).all()
        left = await session.scalar(select(func.count()).select_from(Observer).where(on_service(services[0])))
    assert sorted(moved) == sorted((oid, 2, on_new) for oid in moving)
    assert left == 0
