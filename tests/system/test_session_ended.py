"""Observers whose starts the broker still holds for an ended session say so (issue 65): a
node killed, its service speaks from a new session on another node at once, and that
session's first inventory releases what the old one ran. Each such observer's history says
why it runs nowhere (a ``released`` event naming the ended session), and so do the API
(``paused``), ``/api/stats`` (``awaiting_broker``) and the metrics, until the broker hands
its start on; then it runs again, never on two services at once, and nothing says paused.
The lost-start repair leaves those starts alone: the broker holds them, and a copy published
meanwhile would run beside each.

The start queue is declared beforehand as an older release declared it, without the
queue's own 2 s ``x-consumer-disconnected-timeout``, so the broker's node-wide timeout (20 s
in ``deploy/rabbitmq/cluster.conf``) sets the wait: long enough that nothing races the
release. A start queue of this release hands on after 2 s."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from manager.state.service_reports import SESSION_ENDED
from shared import topology
from tests.system.test_cluster import Fleet, fleet_on_cluster, ticking_since
from tests.system.test_fencing import assert_never_on_two_services
from tests.system.test_hand_on import declare_as_an_older_release
from tools.harness import System, metric, wait_for

COUNT = 30


@pytest.fixture
def fleet(database: str, plugin_path: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    yield from fleet_on_cluster(database, plugin_path, tmp_path, request)


def said_why(system: System, ids: list[str], service_id: str) -> bool:
    """Every one of ``ids`` has a ``released`` event from ``service_id`` saying its session ended."""
    for oid in ids:
        events = system.get(f"/api/observers/{oid}/events").json()
        if not any(
            e["event"] == "released" and e["from_service_id"] == service_id and e["detail"] == SESSION_ENDED
            for e in events
        ):
            return False
    return True


def awaiting(system: System) -> set[str]:
    """The observers the API says are paused waiting for the broker."""
    return {o["id"] for o in system.observers() if "waits for the broker" in (o.get("paused") or "")}


def test_observers_released_by_a_new_session_say_their_start_waits_for_the_broker(fleet: Fleet, tmp_path: Path) -> None:
    system, nodes = fleet.system, fleet.nodes
    # The lost-start repair at its quickest: a copy of a start the broker holds would run beside it
    system.env["ORCH_LOST_START_AFTER_S"] = "2"
    declare_as_an_older_release(system, topology.start_queue_name("default"))
    ticks = tmp_path / "ticks.log"
    services, ids = fleet.start(ticks, COUNT)
    wait_for(lambda: fleet.all_processing_on_alive(ids), 120, "all Processing")
    node, victim = nodes[2], services[2]  # not the manager's node
    assert f"broker session open on 127.0.0.1:{node.port}" in victim.text()
    victim_id = next(s["id"] for s in system.services() if s["name"] == victim.name and s["status"] == "alive")
    theirs = [o["id"] for o in system.observers() if o["service_id"] == victim_id]
    assert theirs, f"{victim.name} runs none of the observers"
    others = [oid for oid in ids if oid not in set(theirs)]

    killed_at = time.time()
    node.kill()
    try:
        wait_for(lambda: said_why(system, theirs, victim_id), 30, "the released events saying the session ended")
        wait_for(lambda: awaiting(system) == set(theirs), 10, "the API to say they wait for the broker")
        assert system.get("/api/stats").json()["awaiting_broker"] == len(theirs)
        assert metric(system, "orch_observers_awaiting_broker") == len(theirs)
        wait_for(lambda: ticking_since(ticks, ids, killed_at + 1), 90, "all running again")
        wait_for(lambda: fleet.all_processing_on_alive(ids), 60, "all Processing")
    finally:
        node.start()
    assert awaiting(system) == set()
    assert system.get("/api/stats").json()["awaiting_broker"] == 0
    manager = system.manager
    assert manager is not None
    assert "start(s) that were in no queue" not in manager.text(), "a start the broker held was published again"
    # Only what the ended session held was released for it
    assert not any(
        e["detail"] == SESSION_ENDED for oid in others for e in system.get(f"/api/observers/{oid}/events").json()
    )
    assert_never_on_two_services(ticks)
