"""Observer counts kept by the triggers of migration 0003, against a real PostgreSQL: they
must always equal a ``GROUP BY`` of the observers table, before and after folding, whatever
statements changed the rows."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

from sqlalchemy import select, text

from manager.db.counts import fold_deltas, live_in_pool_query, observer_counts
from manager.db.engine import make_engine, make_sessionmaker

_INSERT = text(
    "INSERT INTO observers (id, name, kind, pool, status) "
    "SELECT id, 'o-' || id, kind, pool, 'Created' "
    "FROM unnest(CAST(:ids AS uuid[]), CAST(:kinds AS text[]), CAST(:pools AS text[])) AS v(id, kind, pool)"
)


async def test_counts_equal_a_scan_after_any_change_and_any_fold(database: str) -> None:
    engine = make_engine(database)
    sessions = make_sessionmaker(engine)

    async def scanned() -> Counter[tuple[str, str, str]]:
        async with sessions() as s:
            rows = await s.execute(text("SELECT kind, pool, status::text, count(*) FROM observers GROUP BY 1, 2, 3"))
            return Counter({(k, p, st): n for k, p, st, n in rows.all()})

    async def counted() -> Counter[tuple[str, str, str]]:
        async with sessions() as s:
            return Counter({(c.kind, c.pool, c.status.value): c.n for c in await observer_counts(s)})

    async def change(sql: str, **params: object) -> None:
        async with sessions.begin() as s:
            await s.execute(text(sql), params)
        assert await counted() == await scanned(), sql

    try:
        ids = [uuid.uuid4() for _ in range(300)]
        kinds = ["ticker" if i % 3 else "http_poll" for i in range(300)]
        pools = ["default" if i % 4 else "gpu" for i in range(300)]
        await change(_INSERT.text, ids=ids, kinds=kinds, pools=pools)
        await change("UPDATE observers SET status = 'Processing' WHERE id = ANY(CAST(:ids AS uuid[]))", ids=ids[:200])
        await change("UPDATE observers SET attempts = attempts + 1")  # no status change: no delta
        await change("UPDATE observers SET status = 'OnDeleting' WHERE id = ANY(CAST(:ids AS uuid[]))", ids=ids[:50])
        async with sessions.begin() as s:
            await fold_deltas(s)
        assert await counted() == await scanned()
        await change("UPDATE observers SET status = 'Deleted' WHERE status = 'OnDeleting'")
        await change(
            "UPDATE observers SET status = 'Failed', pool = 'default' WHERE pool = 'gpu' AND status = 'Created'"
        )
        await change("DELETE FROM observers WHERE id = ANY(CAST(:ids AS uuid[]))", ids=ids[250:])

        async def fold() -> None:
            async with sessions.begin() as s:
                await fold_deltas(s)

        await asyncio.gather(fold(), fold(), fold())  # concurrent folds move each delta once
        assert await counted() == await scanned()
        async with sessions() as s:
            deltas = (await s.execute(text("SELECT count(*) FROM observer_count_deltas"))).scalar_one()
            assert deltas == 0
            live = (await scanned()).items()
            for pool in ("default", "gpu"):
                expected = sum(
                    n for (_, p, st), n in live if p == pool and st in ("Created", "Processing", "OnDeleting")
                )
                assert (await s.execute(select(live_in_pool_query(pool)))).scalar_one() == expected > 0
    finally:
        await engine.dispose()
