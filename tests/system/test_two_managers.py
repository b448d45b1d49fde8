"""Two managers on one database and one broker (docs/design.md, "Two managers"): both serve
creates, stops and reads; exactly one (the leader, ``manager/state/leadership.py``) applies
state reports and runs the repairs; a ``kill -9`` of it hands the lead to the other, which
applies the backlog; nothing is applied twice."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections import Counter

from sqlalchemy import text

from manager.db.engine import make_engine
from tools.harness import System, free_port, metric, wait_for


def _leader(system: System) -> str | None:
    name: str | None = system.get("/api/stats").json()["state_applied_by"]
    return name


def event_counts(database_url: str) -> Counter[tuple[str, str]]:
    """(observer id, event) -> how many times the history has it: what a scan for things
    applied twice reads."""

    async def read() -> Counter[tuple[str, str]]:
        engine = make_engine(database_url)
        try:
            async with engine.connect() as connection:
                rows = await connection.execute(text("SELECT observer_id::text, event FROM observer_events"))
                return Counter((observer, event) for observer, event in rows.all())
        finally:
            await engine.dispose()

    return asyncio.run(read())


def _second(system: System) -> System:
    """Another manager's view of the same system: its own port and log folder."""
    workdir = system.workdir / "b"
    workdir.mkdir()
    return dataclasses.replace(system, manager_port=free_port(), procs=[], manager=None, workdir=workdir)


def test_two_managers_serve_the_api_one_leads_and_the_other_takes_over(system: System) -> None:
    a, b = system, _second(system)
    try:
        manager_a = a.start_manager(ORCH_MANAGER_NAME="manager-a")
        wait_for(lambda: _leader(a) == "manager-a", 30, "manager-a to lead")
        b.start_manager(ORCH_MANAGER_NAME="manager-b")
        a.start_service("svc-1", workers=200)
        a.start_service("svc-2", workers=200)

        # Both serve the API; only the leader applies state and runs the repairs.
        first = [a.create(f"via-a-{i}")["id"] for i in range(20)] + [b.create(f"via-b-{i}")["id"] for i in range(20)]
        for observer in first:
            (a if observer in first[:20] else b).wait_status(observer, "Processing")
        assert _leader(b) == "manager-a"
        assert metric(a, "orch_state_leader") == 1
        assert metric(b, "orch_state_leader") == 0
        for observer in first[:5]:
            assert b.delete(f"/api/observers/{observer}").status_code == 202
        for observer in first[:5]:
            a.wait_status(observer, "Deleted")

        # The leader killed: what the services report meanwhile waits in the state queue for
        # the other manager, which takes the lead and applies it.
        manager_a.kill9()
        killed_at = time.monotonic()
        after = [b.create(f"after-{i}")["id"] for i in range(30)]
        for observer in first[5:10]:
            assert b.delete(f"/api/observers/{observer}").status_code == 202
        wait_for(lambda: _leader(b) == "manager-b", 30, "manager-b to lead")
        for observer in after:
            b.wait_status(observer, "Processing")
        for observer in first[5:10]:
            b.wait_status(observer, "Deleted")
        print(f"the backlog applied {time.monotonic() - killed_at:.1f}s after the leader's kill -9")
        assert metric(b, "orch_state_leader") == 1

        # Back with the same name, the old leader stands by.
        a.start_manager(ORCH_MANAGER_NAME="manager-a")
        assert _leader(a) == "manager-b"
        stopped = [a.create(f"late-{i}")["id"] for i in range(5)]
        for observer in stopped:
            a.wait_status(observer, "Processing")
            assert a.delete(f"/api/observers/{observer}").status_code == 202
        for observer in stopped:
            b.wait_status(observer, "Deleted")

        # Nothing applied twice: each observer was created, started and stopped once.
        counts = event_counts(system.database_url)
        for observer in first + after + stopped:
            assert counts[(observer, "created")] == 1, observer
            assert counts[(observer, "started")] == 1, observer
        for observer in first[:10] + stopped:
            assert counts[(observer, "stopped")] == 1, observer
        assert not any(event in ("moved", "released", "host_lost") for _, event in counts)
    finally:
        b.stop_all()
        print(b.logs())


def test_a_frozen_leader_gives_way_and_steps_down_when_it_wakes(system: System) -> None:
    """PostgreSQL ends the session of a leader unheard for ``ORCH_LEADER_TIMEOUT_S``: the
    other manager leads meanwhile, and the old leader, woken, stands by."""
    a, b = system, _second(system)
    try:
        manager_a = a.start_manager(ORCH_MANAGER_NAME="manager-a", ORCH_LEADER_TIMEOUT_S="3")
        wait_for(lambda: _leader(a) == "manager-a", 30, "manager-a to lead")
        b.start_manager(ORCH_MANAGER_NAME="manager-b", ORCH_LEADER_TIMEOUT_S="3")
        a.start_service("svc-1", workers=50)
        frozen = manager_a.state_process()
        assert frozen is not None
        os.kill(frozen, signal.SIGSTOP)
        try:
            created = [b.create(f"o-{i}")["id"] for i in range(10)]
            wait_for(lambda: _leader(b) == "manager-b", 30, "manager-b to lead")
            for observer in created:
                b.wait_status(observer, "Processing")
        finally:
            os.kill(frozen, signal.SIGCONT)
        wait_for(lambda: "manager-a gave up the lead" in manager_a.text(), 30, "the woken leader to step down")
        wait_for(lambda: metric(a, "orch_state_leader") == 0, 30, "manager-a to stand by")
        assert _leader(a) == "manager-b"
        assert metric(b, "orch_state_leader") == 1
        assert a.delete(f"/api/observers/{created[0]}").status_code == 202
        a.wait_status(created[0], "Deleted")
    finally:
        b.stop_all()
        print(b.logs())
