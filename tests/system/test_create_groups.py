"""Concurrent single creates share one transaction and one publish (``manager/create_groups.py``,
issue 17), and each request keeps the answer it would have had alone: its own 422 at once,
its own 409 for a name taken or repeated in its group, its own 503 past a full pool."""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.system.test_write_races import wait_blocked_on_a_lock
from tools.harness import System, metric, wait_for


def ticker(name: str, kind: str = "ticker") -> dict[str, Any]:
    return {"name": name, "kind": kind, "args": {"emit": False}}


async def created_while_a_group_waits(
    system: System, waiting: list[dict[str, Any]], invalid: list[dict[str, Any]] | None = None
) -> tuple[httpx.Response, list[httpx.Response]]:
    """Post a first create while the pool's create lock is held elsewhere, so its group of
    one waits in the database; post ``waiting`` meanwhile (they queue for the next group) and
    ``invalid`` (answered before any group); then let the lock go. The first's answer and
    the others' (``waiting``, then ``invalid``) in the order given."""
    engine = create_async_engine(system.database_url)
    try:
        async with (
            engine.connect() as other,
            httpx.AsyncClient(base_url=system.base_url, headers=system.headers(), timeout=60) as client,
        ):
            await other.execute(text("SELECT pg_advisory_lock(:k)"), {"k": zlib.crc32(b"default")})
            first = asyncio.create_task(client.post("/api/observers", json=ticker("first")))
            await wait_blocked_on_a_lock(engine, "pg_advisory_xact_lock")
            queued = [asyncio.create_task(client.post("/api/observers", json=body)) for body in waiting]
            refused = [await client.post("/api/observers", json=body) for body in invalid or []]
            await asyncio.to_thread(
                wait_for,
                lambda: metric(system, "orch_api_creates_waiting") == len(waiting),
                30,
                "every create queued behind the first",
            )
            await other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": zlib.crc32(b"default")})
            await other.commit()
            return await first, [*(await asyncio.gather(*queued)), *refused]
    finally:
        await engine.dispose()


async def test_creates_that_arrive_together_share_a_group_and_keep_their_own_answers(system: System) -> None:
    # Given a service with room for all, and a live observer named "taken"
    system.start_manager()
    system.start_service("svc-a", workers=40)
    system.create("taken", args={"emit": False})
    groups, grouped = (metric(system, f"orch_api_create_group_size_{m}") for m in ("count", "sum"))
    # When 20 creates arrive while the one before them waits for the pool's create lock:
    # 15 new names, one name twice, one taken name, and one of a kind nobody offers
    fresh = [ticker(f"o-{i}") for i in range(15)]
    first, answers = await created_while_a_group_waits(
        system, [*fresh, ticker("twin"), ticker("twin"), ticker("taken")], invalid=[ticker("x", kind="no-such-kind")]
    )
    *new, twin_a, twin_b, taken, unknown_kind = answers
    # Then the bad one was answered alone, before any group ran
    assert unknown_kind.status_code == 422, unknown_kind.text
    # and the others went in two groups: the first alone, then the 18 that waited together
    assert metric(system, "orch_api_create_group_size_count") - groups == 2
    assert metric(system, "orch_api_create_group_size_sum") - grouped == 19
    # Each kept its own answer: the group's conflict split it, and each create ran alone
    assert first.status_code == 201, first.text
    assert [r.status_code for r in new] == [201] * 15, [r.text for r in new if r.status_code != 201]
    assert sorted([twin_a.status_code, twin_b.status_code]) == [201, 409], (twin_a.text, twin_b.text)
    assert taken.status_code == 409 and "'taken'" in taken.json()["detail"], taken.text
    # and every created observer runs
    for response in [first, *new, twin_a if twin_a.status_code == 201 else twin_b]:
        system.wait_status(response.json()["id"], "Processing")
    assert len(system.observers(name="twin")) == 1


async def test_a_group_past_a_full_pool_fills_it_and_refuses_the_rest(system: System) -> None:
    # Given a pool with 6 workers
    system.start_manager()
    system.start_service("svc-a", workers=6)
    wait_for(lambda: system.get("/api/stats").json()["capacity"]["default"]["total"] == 6, what="capacity")
    # When 8 creates arrive while the one before them waits for the pool's create lock
    first, answers = await created_while_a_group_waits(system, [ticker(f"o-{i}") for i in range(8)])
    # Then the pool is filled (the first and 5 of the 8), and the other 3 are told it is full
    assert first.status_code == 201, first.text
    codes = sorted(r.status_code for r in answers)
    assert codes == [201] * 5 + [503] * 3, [r.text for r in answers]
    assert all("is full" in r.json()["detail"] for r in answers if r.status_code == 503)
    for response in [first, *(r for r in answers if r.status_code == 201)]:
        system.wait_status(response.json()["id"], "Processing")
    assert system.get("/api/stats").json()["capacity"]["default"] == {"total": 6, "used": 6, "free": 0}
