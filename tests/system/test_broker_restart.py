"""The broker restarts, everything loses power at once (issue #2 tests 9 and 10), or the
manager is cut off from the broker."""

from __future__ import annotations

import pytest

from tools import infra
from tools.harness import System, wait_for
from tools.partition import Direction, Partition


def start_fleet(system: System, count: int) -> list[str]:
    system.start_manager()
    system.start_service("svc-a", workers=count)
    system.start_service("svc-b", workers=count)
    args = {"interval_s": 0.2}
    ids = [system.create(f"o-{i}", args=args)["id"] for i in range(count)]
    for oid in ids:
        system.wait_status(oid, "Processing")
    return ids


def all_processing_on_alive(system: System, ids: list[str]) -> bool:
    alive = {s["id"] for s in system.services() if s["status"] == "alive"}
    observers = {o["id"]: o for o in system.observers()}
    return all(observers[i]["status"] == "Processing" and observers[i]["service_id"] in alive for i in ids)


def test_broker_restart_loses_no_observer(system: System, rabbit: infra.RabbitNode) -> None:
    ids = start_fleet(system, 6)
    services = list(system.procs[1:])

    rabbit.stop()
    try:
        # While the broker is down a create is refused and leaves nothing behind, and stops
        # are refused before anything changes (503 with Retry-After, like the database down)
        wait_for(lambda: system.get("/readyz").status_code == 503, 30, "readyz to report the broker down")
        refused = [
            system.post("/api/observers", {"name": "during-outage", "kind": "ticker"}),
            system.delete(f"/api/observers/{ids[0]}"),
            system.post("/api/observers/bulk-stop", {"ids": ids[:2]}),
        ]
        for response in refused:
            assert response.status_code == 503 and "broker" in response.json()["detail"], response.text
            assert int(response.headers["retry-after"]) > 0
    finally:
        rabbit.start()  # even on failure: later tests need the broker

    # Services reconnect by themselves and every observer runs again
    wait_for(lambda: all(p.text().count("broker session open") >= 2 for p in services), 60, "reconnected")
    wait_for(lambda: all_processing_on_alive(system, ids), 60, "all Processing again")
    assert all(p.alive() for p in system.procs)
    assert len(system.observers()) == len(ids)
    assert system.get("/api/observers", name="during-outage").json()["items"] == []
    # An ordinary restart is told once, in the product's own words: no ERROR, no traceback
    # (aiormq and aio-pika log one of each per attempt to reconnect: shared/logs.py)
    wait_for(lambda: system.get("/readyz").status_code == 200, 30, "the manager to reconnect")
    manager = system.manager
    assert manager is not None
    # Both of its processes (API and state) say it; /readyz may answer 200 a moment before the
    # line is written (the connection is up before aio-pika runs its reconnect callbacks)
    wait_for(lambda: manager.text().count("connected to the broker after") >= 2, 30, "both to say they reconnected")
    assert manager.text().count("the broker is unreachable (lost the connection: ConnectionClosed") == 2, manager.text()
    # ... and once per outage, not per attempt (shared/outage.py): the attempts that failed
    # in between are DEBUG, and so is each service's session that never opened
    assert manager.text().count("the broker is unreachable") == 2, manager.text()
    for proc in services:
        text = proc.text()
        assert text.count("cannot open a broker session (") == 1, f"{proc.name}: {text[-4000:]}"
        assert text.count("broker session open again after") == 1, f"{proc.name}: {text[-4000:]}"
        assert "open failed" not in text, f"{proc.name}: {text[-4000:]}"
    for proc in system.procs:
        text = proc.text()
        assert "Traceback" not in text and " ERROR [" not in text, f"{proc.name}: {text[-4000:]}"


def test_blackout_everything_comes_back(system: System, rabbit: infra.RabbitNode, postgres: infra.PostgresNode) -> None:
    ids = start_fleet(system, 5)

    # Power cut: every process dies at once
    system.stop_all()
    rabbit.kill()
    postgres.kill()

    # Power back: infrastructure first, then the same deployment
    rabbit.start()
    postgres.start()
    system.start_manager()
    system.start_service("svc-a", workers=5)
    system.start_service("svc-b", workers=5)

    wait_for(lambda: all_processing_on_alive(system, ids), 60, "the same observers Processing")
    names = {s["name"] for s in system.services() if s["status"] == "alive"}
    assert names == {"svc-a", "svc-b"}
    assert all(s["status"] == "deleted" for s in system.services() if s["name"] in names and s["status"] != "alive")


@pytest.mark.parametrize(
    ("state_process", "direction"), [("true", "both"), ("false", "both"), ("true", "to_server"), ("true", "to_client")]
)
def test_a_manager_cut_off_from_the_broker_keeps_its_state_side_and_heals(
    system: System, state_process: str, direction: Direction
) -> None:
    """Cut both ways, or deaf (``to_client``), the manager gives its connections up by its
    own heartbeat check; unheard (``to_server``), the broker closes them and it hears so."""
    # Given a manager that reaches the broker through a network that can be cut
    with Partition.before(system.amqp_url) as network:
        manager = system.start_manager(ORCH_AMQP_URL=network.url_for(system.amqp_url), ORCH_STATE_PROCESS=state_process)
        system.start_service("svc-a", workers=10)
        ids = [system.create(f"o-{i}")["id"] for i in range(3)]
        for oid in ids:
            system.wait_status(oid, "Processing")

        # When the network drops everything for longer than the AMQP heartbeat's grace, so
        # that the manager gives its connections up with calls still waiting on them
        sides = 2 if state_process == "true" else 1  # each has a connection of its own
        network.cut(direction)
        wait_for(
            lambda: manager.text().count("the broker is unreachable (lost the connection") >= sides,
            60,
            "the manager to give up",
        )
        during = system.post("/api/observers", {"name": "during-cut", "kind": "ticker"})
        assert during.status_code == 503 and "broker" in during.json()["detail"], during.text
        network.heal()

        # Then it reconnects with the same processes, and serves: a create runs, a stop ends
        wait_for(lambda: manager.text().count("connected to the broker after") >= sides, 60, "a reconnection")
        wait_for(lambda: system.get("/readyz").status_code == 200, 30, "ready again")
        after = system.create("after-cut")["id"]
        system.wait_status(after, "Processing")
        assert system.delete(f"/api/observers/{ids[0]}").status_code == 202
        system.wait_status(ids[0], "Deleted")
        said = manager.text()
        assert manager.alive(), said[-4000:]
        assert "state process exited" not in said and "state side stopped" not in said, said[-4000:]
        cause = "AMQPConnectionError" if direction == "to_server" else "no frame from the broker for"
        assert said.count(f"the broker is unreachable (lost the connection: {cause}") == sides, said[-4000:]
        assert "Traceback" not in said and " ERROR [" not in said, said[-4000:]
