"""Held digests kept by the triggers of migration 0008, against a real PostgreSQL: for every
(service, session) they must equal the count and XOR of its Processing and OnDeleting rows,
before and after folding, whatever statements changed the rows."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import text

from manager.db.digests import fold_digest_deltas, held_digest
from manager.db.engine import make_engine, make_sessionmaker
from shared.messages import digest_of

_INSERT = text(
    "INSERT INTO observers (id, name, kind, pool, status, service_id, host_session_id) "
    "SELECT id, 'o-' || id, 'ticker', 'default', CAST(status AS observer_status), service_id, session_id "
    "FROM unnest(CAST(:ids AS uuid[]), CAST(:statuses AS text[]), CAST(:services AS uuid[]), "
    "CAST(:sessions AS uuid[])) AS v(id, status, service_id, session_id)"
)
_HELD = text(
    "SELECT id FROM observers WHERE service_id = :service_id AND host_session_id = :session_id "
    "AND status IN ('Processing', 'OnDeleting')"
)


async def test_kept_digests_equal_the_rows_after_any_change_and_any_fold(database: str) -> None:
    engine = make_engine(database)
    sessions = make_sessionmaker(engine)
    svc_a, svc_b = uuid.uuid4(), uuid.uuid4()
    a1, a2, b1 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()  # a2: svc_a's next session
    holders = [(svc_a, a1), (svc_a, a2), (svc_b, b1), (svc_a, b1)]

    async def check(what: str) -> None:
        async with sessions() as s:
            for service_id, session_id in holders:
                ids = (await s.execute(_HELD, {"service_id": service_id, "session_id": session_id})).scalars().all()
                kept = await held_digest(s, service_id, session_id)
                assert kept == (len(ids), digest_of(ids)), f"{what}: {service_id}/{session_id}"

    async def change(sql: str, **params: object) -> None:
        async with sessions.begin() as s:
            await s.execute(text(sql), params)
        await check(sql)

    async def fold() -> None:
        async with sessions.begin() as s:
            await fold_digest_deltas(s)

    try:
        async with sessions.begin() as s:
            for service_id in (svc_a, svc_b):
                await s.execute(
                    text("INSERT INTO services (id, name, workers_count, status) VALUES (:id, 'svc', 500, 'alive')"),
                    {"id": service_id},
                )
        ids = [uuid.uuid4() for _ in range(300)]
        # Created rows (held by nobody), and rows inserted already held (an adoption)
        await change(
            _INSERT.text,
            ids=ids,
            statuses=["Created" if i < 200 else "Processing" for i in range(300)],
            services=[None if i < 200 else svc_b for i in range(300)],
            sessions=[None if i < 200 else b1 for i in range(300)],
        )
        await change(
            "UPDATE observers SET status = 'Processing', service_id = :s, host_session_id = :h "
            "WHERE id = ANY(CAST(:ids AS uuid[]))",
            s=svc_a,
            h=a1,
            ids=ids[:150],
        )
        await change("UPDATE observers SET attempts = attempts + 1")  # no holder change: no delta
        await change("UPDATE observers SET status = 'OnDeleting' WHERE id = ANY(CAST(:ids AS uuid[]))", ids=ids[:40])
        await fold()
        await check("after a fold")
        await change("UPDATE observers SET status = 'Deleted' WHERE status = 'OnDeleting'")
        # svc_a's session ends and its observers move: some to svc_b, some back to svc_a's new one
        await change(
            "UPDATE observers SET service_id = NULL, host_session_id = NULL, status = 'Created' "
            "WHERE host_session_id = :h",
            h=a1,
        )
        await change(
            "UPDATE observers SET service_id = :s, host_session_id = :h, status = 'Processing' "
            "WHERE id = ANY(CAST(:ids AS uuid[]))",
            s=svc_a,
            h=a2,
            ids=ids[40:100],
        )
        await change(
            "UPDATE observers SET host_session_id = :h WHERE id = ANY(CAST(:ids AS uuid[]))", h=b1, ids=ids[90:100]
        )
        await change(
            "UPDATE observers SET service_id = :s WHERE id = ANY(CAST(:ids AS uuid[]))", s=svc_b, ids=ids[90:100]
        )
        await change("DELETE FROM observers WHERE id = ANY(CAST(:ids AS uuid[]))", ids=ids[250:])

        await asyncio.gather(fold(), fold(), fold())  # concurrent folds move each delta once
        await check("after concurrent folds")
        async with sessions() as s:
            deltas = (await s.execute(text("SELECT count(*) FROM held_digest_deltas"))).scalar_one()
            kept = (await s.execute(text("SELECT count(*) FROM held_digests"))).scalar_one()
        assert deltas == 0
        assert kept == 2  # a1 holds nothing any more: its row is gone, not kept at zero
    finally:
        await engine.dispose()
