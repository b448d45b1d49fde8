"""``GET /api/history`` against a real manager, broker, database and services: what the
dashboard's charts plot (counts per status, creates, stops and failovers per minute, each
service's load) follows what happened, and a service killed with ``kill -9`` shows as
failovers of exactly the observers it held."""

from __future__ import annotations

from typing import Any

from tools.harness import System, unique, wait_for

SAMPLE_S = "1"


def history(system: System) -> dict[str, Any]:
    response = system.get("/api/history")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def last(values: list[Any]) -> Any:
    return values[-1] if values else None


def test_the_history_follows_creates_stops_failovers_and_load(system: System) -> None:
    # Given a manager sampling every second and two services
    system.start_manager(ORCH_HISTORY_SAMPLE_S=SAMPLE_S)
    victim = system.start_service("svc-a", workers=10)
    system.start_service("svc-b", workers=10)
    wait_for(lambda: len(history(system)["at"]) >= 2, 20, "two samples")

    # When six tickers are created and two of them stopped
    prefix = unique("hist")
    created = [system.create(f"{prefix}-{i}", args={"interval_s": 1}) for i in range(6)]
    for o in created:
        system.wait_status(o["id"], "Processing")
    for o in created[:2]:
        assert system.delete(f"/api/observers/{o['id']}").status_code == 202
    for o in created[:2]:
        system.wait_status(o["id"], "Deleted")

    # Then the history counts them, per status and per minute, and each service's load
    def settled() -> dict[str, Any]:  # {} (falsy) until it holds
        h = history(system)
        ok = last(h["observers"]["Processing"]) == 4 and sum(h["per_minute"]["stopped"]) == 2
        return h if ok else {}

    h = wait_for(settled, 20, "the history to show 4 Processing and 2 stopped")
    assert h["period_s"] == 1.0 and h["window_s"] == 3600
    assert sum(h["per_minute"]["created"]) == 6
    assert last(h["observers"]["Deleted"]) == 2 and last(h["observers"]["Failed"]) == 0
    assert len(h["observers"]["Processing"]) == len(h["at"])
    loads = {s["name"]: s for s in h["services"]}
    assert set(loads) == {"svc-a", "svc-b"}
    assert last(loads["svc-a"]["workers"]) == 10
    held_by_victim = [o for o in system.observers(q=prefix, status="Processing") if o["service_name"] == "svc-a"]

    def loads_say_four() -> bool:
        h = history(system)
        return sum(last(s["running"]) or 0 for s in h["services"]) == 4

    wait_for(loads_say_four, 20, "the services' heartbeats to report 4 running")

    # When the service holding some of them is killed, the other takes them over
    assert held_by_victim, "the round robin gave svc-a none of them"
    victim.kill9()

    def taken_over() -> bool:
        return all(system.observer(o["id"])["service_name"] == "svc-b" for o in held_by_victim)

    wait_for(taken_over, 60, "the takeover")

    # Then the history counts one failover per observer it held, and svc-a drops out of the load
    def failovers() -> dict[str, Any]:
        h = history(system)
        loads = {s["name"]: s for s in h["services"]}
        done = sum(h["per_minute"]["failovers"]) == len(held_by_victim) and last(loads["svc-a"]["running"]) is None
        return h if done else {}

    h = wait_for(failovers, 60, f"{len(held_by_victim)} failovers in the history and svc-a not alive")
    assert last(h["observers"]["Processing"]) == 4
    assert sum(h["per_minute"]["created"]) == 6  # a failover creates nothing
