"""Bulk create and bulk stop: all-or-nothing creates, stops listed per id."""

from __future__ import annotations

import uuid

from shared import topology
from tools.harness import System, wait_for


def specs(prefix: str, count: int) -> list[dict[str, object]]:
    return [{"name": f"{prefix}-{i}", "kind": "ticker", "args": {"interval_s": 2}} for i in range(count)]


def test_bulk_create_then_bulk_stop(system: System) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=40)
    system.start_service("svc-b", workers=40)

    response = system.post("/api/observers/bulk", {"observers": specs("bulk", 60)})
    assert response.status_code == 201, response.text
    ids = [o["id"] for o in response.json()["items"]]
    assert len(ids) == 60 and [o["name"] for o in response.json()["items"]] == [f"bulk-{i}" for i in range(60)]
    wait_for(lambda: len(system.observers(status="Processing")) == 60, 30, "all Processing")
    assert {o["service_name"] for o in system.observers()} == {"svc-a", "svc-b"}

    gone = str(uuid.uuid4())
    stop = system.post("/api/observers/bulk-stop", {"ids": [*ids[:50], gone]})
    assert stop.status_code == 202
    assert sorted(stop.json()["stopping"]) == sorted(ids[:50]) and stop.json()["unknown"] == [gone]
    wait_for(lambda: len(system.observers(status="Deleted")) == 50, 30, "50 Deleted")
    again = system.post("/api/observers/bulk-stop", {"ids": ids[:2]}).json()
    assert sorted(again["final"]) == sorted(ids[:2]) and again["stopping"] == []
    assert len(system.observers(status="Processing")) == 10
    assert system.queue_counts(topology.start_queue_name("default"))[0] == 0


def test_bulk_create_is_all_or_nothing(system: System) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=10)
    system.create("taken", args={"interval_s": 2})

    clash = system.post("/api/observers/bulk", {"observers": [*specs("ok", 3), {"name": "taken", "kind": "ticker"}]})
    assert clash.status_code == 409 and "'taken'" in clash.json()["detail"]

    repeated = system.post("/api/observers/bulk", {"observers": specs("same", 2) + specs("same", 1)})
    assert repeated.status_code == 422 and "'same-0'" in repeated.json()["detail"]

    bad = specs("bad", 3)
    bad[2]["args"] = {"interval_s": "soon"}
    invalid = system.post("/api/observers/bulk", {"observers": bad})
    assert invalid.status_code == 422 and "observers[2]" in invalid.json()["detail"]

    too_many = system.post("/api/observers/bulk", {"observers": specs("many", 12)})
    assert too_many.status_code == 503 and "full" in too_many.json()["detail"]

    assert system.post("/api/observers/bulk", {"observers": []}).status_code == 422
    assert [o["name"] for o in system.observers()] == ["taken"]
