"""``observer_hosts`` (the services' index: a name older than "host" meaning only a
machine), kept by the triggers of migration 0011, against a real PostgreSQL: after
any statement that inserts, changes or deletes observer rows it holds exactly the
``(id, service_id)`` of every row that has a service, and queries by service through it find
what the rows say."""

from __future__ import annotations

import uuid

from sqlalchemy import select, text

from manager.db.engine import make_engine, make_sessionmaker
from manager.db.models import Observer
from manager.db.service_observers import on_service

_INSERT = text(
    "INSERT INTO observers (id, name, kind, pool, status, service_id) "
    "SELECT id, 'o-' || id, 'ticker', 'default', CAST(status AS observer_status), service_id "
    "FROM unnest(CAST(:ids AS uuid[]), CAST(:statuses AS text[]), CAST(:services AS uuid[])) "
    "AS v(id, status, service_id)"
)
_ROWS = text("SELECT id, service_id FROM observers WHERE service_id IS NOT NULL")
_MIRROR = text("SELECT observer_id, service_id FROM observer_hosts")


async def test_the_service_mirror_equals_the_rows_after_any_change(database: str) -> None:
    engine = make_engine(database)
    sessions = make_sessionmaker(engine)
    svc_a, svc_b, svc_c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    async def check(what: str) -> None:
        async with sessions() as s:
            rows = {(oid, sid) for oid, sid in (await s.execute(_ROWS)).all()}
            mirror = {(oid, sid) for oid, sid in (await s.execute(_MIRROR)).all()}
            assert mirror == rows, what
            for service in (svc_a, svc_b, svc_c):
                found = set((await s.execute(select(Observer.id).where(on_service(service)))).scalars().all())
                assert found == {oid for oid, sid in rows if sid == service}, f"{what}: {service}"

    async def change(sql: str, **params: object) -> None:
        async with sessions.begin() as s:
            await s.execute(text(sql), params)
        await check(sql)

    try:
        ids = [uuid.uuid4() for _ in range(300)]
        # Created rows (no service), and rows inserted with one (an adoption)
        await change(
            _INSERT.text,
            ids=ids,
            statuses=["Created" if i < 200 else "Processing" for i in range(300)],
            services=[None if i < 200 else svc_b for i in range(300)],
        )
        await change(
            "UPDATE observers SET status = 'Processing', service_id = :s WHERE id = ANY(CAST(:ids AS uuid[]))",
            s=svc_a,
            ids=ids[:150],
        )
        await change("UPDATE observers SET attempts = attempts + 1")  # no service changed
        # One statement moving rows from two services to a third, and setting some services anew
        await change(
            "UPDATE observers SET service_id = :s WHERE id = ANY(CAST(:ids AS uuid[]))", s=svc_c, ids=ids[100:260]
        )
        await change("UPDATE observers SET service_id = NULL, status = 'Created' WHERE service_id = :s", s=svc_b)
        async with sessions.begin() as s:  # two moves of the same rows in one transaction
            await s.execute(
                text("UPDATE observers SET service_id = :s WHERE service_id = :c"), {"s": svc_b, "c": svc_c}
            )
            await s.execute(
                text("UPDATE observers SET service_id = :s WHERE id = ANY(CAST(:ids AS uuid[]))"),
                {"s": svc_a, "ids": ids[120:140]},
            )
        await check("two moves in one transaction")
        await change("DELETE FROM observers WHERE id = ANY(CAST(:ids AS uuid[]))", ids=ids[130:220])
        await change("DELETE FROM observers WHERE service_id IS NULL")
        async with sessions() as s:
            assert (await s.execute(text("SELECT count(*) FROM observer_hosts"))).scalar_one() > 0
    finally:
        await engine.dispose()


async def test_a_large_move_after_a_small_one_on_the_same_connection_takes_no_quadratic_plan(database: str) -> None:
    """PL/pgSQL plans a trigger's statements once per connection and keeps the plan: a join of
    the transition tables planned for a move of one row (a nested loop) compared every old
    row with every new one in each later move (5,000 rows: 3.7 s instead of 0.2 s, and hours
    for a third of a million at 1,000,000). The join is planned for each statement now; with
    the kept plan this move of 40,000 rows would take minutes, past the generous timeout."""
    engine = make_engine(database)
    sessions = make_sessionmaker(engine)
    svc_a, svc_b = uuid.uuid4(), uuid.uuid4()
    ids = [uuid.uuid4() for _ in range(40_000)]
    try:
        async with sessions.begin() as s:
            await s.execute(
                _INSERT, {"ids": ids, "statuses": ["Processing"] * len(ids), "services": [svc_a] * len(ids)}
            )
        async with sessions.begin() as s:  # one connection: the pool's only one in use
            await s.execute(text("SET LOCAL statement_timeout = '60s'"))
            move = text("UPDATE observers SET service_id = :s WHERE id = ANY(CAST(:ids AS uuid[]))")
            await s.execute(move, {"s": svc_b, "ids": ids[:1]})
            await s.execute(move, {"s": svc_b, "ids": ids[1:]})
        async with sessions() as s:
            on_b = (await s.execute(select(Observer.id).where(on_service(svc_b)))).scalars().all()
        assert len(on_b) == len(ids)
    finally:
        await engine.dispose()
