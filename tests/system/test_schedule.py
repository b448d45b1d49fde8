"""Scheduled start and stop (issue 56, part 3; docs/design.md, "Scheduled start and stop"):
real manager, services, broker and database. The tests assert what happens and its order
(never before start_at), not how late: ``python -m bench.schedule`` measures lateness."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.system.test_cli import cli_json
from tests.system.test_manager_repairs import sql
from tests.system.test_two_managers import _second, event_counts
from tools.harness import Proc, System, metric, probe_args, read_probe_lines, unique, wait_for


def _at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def _events(system: System, observer_id: str) -> list[dict[str, Any]]:
    body: list[dict[str, Any]] = system.get(f"/api/observers/{observer_id}/events").json()
    return body


def _first(events: list[dict[str, Any]], event: str) -> datetime:
    return next(datetime.fromisoformat(e["at"]) for e in events if e["event"] == event)


async def _kill_once_due(database_url: str, manager: Proc) -> None:
    """``kill -9`` of ``manager`` within milliseconds of the first ``due`` event's commit."""
    db = await asyncpg.connect(database_url.replace("+asyncpg", ""))
    try:
        deadline = time.monotonic() + 30
        while not await db.fetchval("SELECT EXISTS (SELECT 1 FROM observer_events WHERE event = 'due')"):
            assert time.monotonic() < deadline, "the scheduler took no batch"
            await asyncio.sleep(0.002)
        manager.kill9()
    finally:
        await db.close()


def _patch(system: System, observer_id: str, body: Any) -> httpx.Response:
    return httpx.patch(f"{system.base_url}/api/observers/{observer_id}", json=body, timeout=10)


def test_a_scheduled_start_never_comes_early_and_stop_times_end_it_expired(system: System) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=5)

    # Given one observer scheduled to run for 2 s, and one running now until a stop_at
    start_at = datetime.now(UTC) + timedelta(seconds=3)
    later = system.create(unique("later"), start_at=start_at.isoformat(), run_for_s=2)
    stop_at = datetime.now(UTC) + timedelta(seconds=4)
    now = system.create(unique("now"), stop_at=stop_at.isoformat())

    # Then the first is Scheduled, and counted so everywhere, its worker reserved
    assert later["status"] == "Scheduled" and datetime.fromisoformat(later["start_at"]) == start_at
    assert later["stop_at"] is None  # run_for_s counts from its start
    assert system.observer(later["id"])["status"] == "Scheduled"
    stats = system.get("/api/stats").json()
    assert stats["observers"]["Scheduled"] == 1
    assert stats["capacity"]["default"]["used"] == 2
    assert 'orch_observers{kind="ticker",pool="default",status="Scheduled"} 1.0' in system.get("/metrics").text
    assert [o["id"] for o in system.observers(status="Scheduled")] == [later["id"]]

    # When their times come, then the first starts, never before its start_at, with its
    # stop_at set from run_for_s; both end Deleted by a normal stop with an `expired` event
    running = system.wait_status(later["id"], "Processing", timeout=30)
    events = _events(system, later["id"])
    assert [e["event"] for e in events][:3] == ["created", "due", "started"]
    assert _first(events, "due") >= start_at and _first(events, "started") >= start_at
    assert datetime.fromisoformat(running["stop_at"]) >= start_at + timedelta(seconds=2)
    for observer, stop in ((later, None), (now, stop_at)):
        system.wait_status(observer["id"], "Deleted", timeout=30)
        history = [e["event"] for e in _events(system, observer["id"])]
        assert history[-2:] == ["expired", "stopped"], history
        if stop is not None:
            assert _first(_events(system, observer["id"]), "expired") >= stop
    assert system.get("/api/stats").json()["observers"]["Scheduled"] == 0


def test_cancel_and_reschedule_before_the_start_and_the_422s(system: System) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=5)

    # A Scheduled observer stopped: Deleted at once, never started, nothing in its queue
    cancelled = system.create(unique("cancel"), start_at=_at(2))
    stopped = system.delete(f"/api/observers/{cancelled['id']}")
    assert stopped.status_code == 202 and stopped.json()["status"] == "Deleted"
    assert system.queue_counts("orch.start.default")[0] == 0
    # Rescheduled: to later, then to now, which starts it; once started, 409
    moved = system.create(unique("moved"), start_at=_at(3600))
    later = _patch(system, moved["id"], {"start_at": _at(7200)})
    assert later.status_code == 200 and later.json()["status"] == "Scheduled"
    assert _patch(system, moved["id"], {"start_at": _at(-1)}).status_code == 200
    system.wait_status(moved["id"], "Processing")
    refused = _patch(system, moved["id"], {"start_at": _at(60)})
    assert refused.status_code == 409 and "only a Scheduled observer" in refused.json()["detail"]
    assert _patch(system, "00000000-0000-0000-0000-000000000000", {"start_at": _at(60)}).status_code == 404
    time.sleep(1.0)  # a few of the scheduler's passes: the cancelled one stays unstarted
    assert [e["event"] for e in _events(system, cancelled["id"])] == ["created", "cancelled"]
    assert system.observer(cancelled["id"])["status"] == "Deleted"

    # Validation: every one a 422 that says what to fix
    naive = datetime.now(UTC).replace(tzinfo=None).isoformat()
    for body, says in (
        ({"start_at": naive}, "add a UTC offset"),
        ({"stop_at": _at(60), "run_for_s": 5}, "give one of them, not both"),
        ({"start_at": _at(60), "stop_at": _at(30)}, "stop_at: must be after start_at"),
        ({"stop_at": _at(-5)}, "stop_at: is not in the future"),
        ({"run_for_s": 0}, "run_for_s"),
        ({"start_at": "9999-01-01T00:00:00Z"}, "start_at: at most 366 days ahead (ORCH_SCHEDULE_MAX_AHEAD_DAYS)"),
    ):
        answer = system.post("/api/observers", {"name": unique("bad"), "kind": "ticker"} | body)
        assert answer.status_code == 422 and says in answer.text, (body, answer.text)
    bulk = system.post(
        "/api/observers/bulk",
        {"observers": [{"name": unique("ok"), "kind": "ticker"}, {"name": "b", "kind": "ticker", "start_at": naive}]},
    )
    assert bulk.status_code == 422 and "observers" in bulk.text and "add a UTC offset" in bulk.text
    assert _patch(system, moved["id"], {"start_at": naive}).status_code == 422
    far = {"name": "far", "kind": "ticker", "start_at": _at(86_400 * 400)}
    bulk = system.post("/api/observers/bulk", {"observers": [{"name": unique("near"), "kind": "ticker"}, far]})
    assert bulk.status_code == 422 and "observers[1].start_at: at most 366 days ahead" in bulk.text, bulk.text
    waiting = system.create(unique("waiting"), start_at=_at(3600))
    assert _patch(system, waiting["id"], {"start_at": _at(86_400 * 400)}).status_code == 422

    # The command line: the same fields
    start_at = _at(3600)
    made = cli_json(system.base_url, "create", unique("cli"), "ticker", "--start-at", start_at, "--run-for", "15m")
    assert made["status"] == "Scheduled" and made["run_for_s"] == 900
    assert datetime.fromisoformat(made["start_at"]) == datetime.fromisoformat(start_at)


@pytest.mark.usefixtures("with_test_plugin")
def test_a_manager_down_across_the_start_time_starts_it_once_when_back(system: System, tmp_path: Path) -> None:
    manager = system.start_manager()
    system.start_service("svc-a", workers=5)
    ticks = tmp_path / "ticks.log"
    start_at = datetime.now(UTC) + timedelta(seconds=3)
    created = system.create(unique("late"), kind="probe", args=probe_args(ticks), start_at=start_at.isoformat())

    # When the manager is killed before the start time and comes back after it
    manager.kill9()
    time.sleep(max(0.0, (start_at - datetime.now(UTC)).total_seconds()) + 1.0)
    assert not read_probe_lines(ticks)  # nobody started it meanwhile
    system.start_manager()

    # Then it starts, late, exactly once: one due, one start, one run on one service
    system.wait_status(created["id"], "Processing")
    wait_for(lambda: len(read_probe_lines(ticks)) >= 5, 15, "five ticks")
    counts = event_counts(system.database_url)
    assert counts[(created["id"], "due")] == 1 and counts[(created["id"], "started")] == 1
    runs = {(service, pid, run) for _, service, pid, _, run in read_probe_lines(ticks)}
    assert len(runs) == 1, runs
    assert min(at for _, _, _, at, _ in read_probe_lines(ticks)) >= start_at.timestamp()


def test_a_thousand_due_in_the_same_second_all_start_once(system: System) -> None:
    system.start_manager(ORCH_MANAGER_NAME="leader")
    wait_for(lambda: system.get("/api/stats").json()["state_applied_by"] == "leader", 30, "the first manager to lead")
    standby = _second(system)
    try:
        standby.start_manager(ORCH_MANAGER_NAME="standby")  # serves the API, fires nothing
        system.start_service("svc-a", workers=1000)
        start_at = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0) + timedelta(seconds=1)
        body = {
            "observers": [
                {"name": f"{unique('n')}-{i}", "kind": "idle", "start_at": start_at.isoformat()} for i in range(1000)
            ]
        }
        answer = standby.post("/api/observers/bulk", body)  # created on the standby
        assert answer.status_code == 201, answer.text
        ids = [o["id"] for o in answer.json()["items"]]
        assert {o["status"] for o in answer.json()["items"]} == {"Scheduled"}

        wait_for(lambda: system.get("/api/stats").json()["observers"]["Processing"] == 1000, 60, "1,000 Processing")
        counts = event_counts(system.database_url)
        assert Counter(counts[(i, "due")] for i in ids) == {1: 1000}
        assert Counter(counts[(i, "started")] for i in ids) == {1: 1000}
        assert metric(system, "orch_scheduled_starts_total") == 1000
        assert metric(standby, "orch_scheduled_starts_total") == 0 and metric(standby, "orch_state_leader") == 0
    finally:
        standby.stop_all()


def test_a_manager_killed_while_it_fires_loses_none_and_fires_none_twice(system: System) -> None:
    manager = system.start_manager()
    system.start_service("svc-a", workers=600)
    start_at = datetime.now(UTC) + timedelta(seconds=3)
    one = {"kind": "idle", "start_at": start_at.isoformat()}
    answer = system.post(
        "/api/observers/bulk", {"observers": [{"name": f"{unique('k')}-{i}"} | one for i in range(500)]}
    )
    assert answer.status_code == 201, answer.text
    ids = [o["id"] for o in answer.json()["items"]]

    # When the manager is killed as soon as its scheduler has taken the batch (committed it,
    # publishing or about to), and started again
    asyncio.run(_kill_once_due(system.database_url, manager))
    system.start_manager(ORCH_PENDING_START_AFTER_S="1")

    # Then every one runs, on one service, and was fired once: starts the kill left unconfirmed
    # are published again by the pending-start repair, and any copy absorbed
    wait_for(lambda: system.get("/api/stats").json()["observers"]["Processing"] == 500, 60, "all 500 Processing")
    wait_for(lambda: system.services()[0]["running"] == 500, 30, "the service to run 500")
    counts = event_counts(system.database_url)
    assert Counter(counts[(i, "due")] for i in ids) == {1: 500}


def test_a_row_whose_start_cannot_be_built_fails_alone(system: System) -> None:
    """Issue 62, item 8: a Scheduled row whose stored fields no longer make a start (edited by
    hand here; another version's row in real life) rolled back every batch, so every due start
    and every stop_at waited behind it. It is now Failed, saying why, and the others go on."""
    system.start_manager()
    system.start_service("svc-a", workers=10)
    expiring = system.create(unique("expiring"), run_for_s=3)
    due = [system.create(unique("due"), start_at=_at(2)) for _ in range(3)]
    broken = due[0]["id"]
    sql(system.database_url, 'UPDATE observers SET retry = \'{"factor": "lots"}\' WHERE id = $1', uuid.UUID(broken))

    for observer in due[1:]:
        system.wait_status(observer["id"], "Processing")
    failed = system.wait_status(broken, "Failed")
    assert "its start could not be built at its start_at" in failed["last_error"] and "factor" in failed["last_error"]
    assert [e["event"] for e in _events(system, broken)][-2:] == ["due", "failed"]
    system.wait_status(expiring["id"], "Deleted")
    assert system.queue_counts("orch.start.default")[0] == 0  # nothing published for the broken one
