"""Fleet faults that used to lose, stop or fail healthy observers (issue 11), each against
real processes; interleavings that need a report at a precise moment use hand-made reports
published to the state queue."""

from __future__ import annotations

import functools
import random
import signal
import time
import uuid
from pathlib import Path

import pytest

from shared import topology
from shared.messages import Message, ObserversHandedOver, ObserversStarted, StopObservers
from tests.system.test_fencing import assert_never_on_two_services
from tests.system.test_manager_repairs import sql
from tools import infra
from tools.harness import System, metric, probe_args, read_ticks, wait_for
from tools.partition import Partition


def event_names(system: System, observer_id: str) -> list[str]:
    return [e["event"] for e in system.get(f"/api/observers/{observer_id}/events").json()]


def publish_report(system: System, report: Message) -> None:
    system.publish_raw(topology.STATE_QUEUE, report.encode())


def close_connections(rabbit: infra.RabbitNode, service_name: str) -> None:
    listing = rabbit.ctl("-q", "list_connections", "--no-table-headers", "pid", "client_properties")
    pids = [line.split("\t")[0] for line in listing.splitlines() if f'"observer-service {service_name}"' in line]
    assert pids, listing
    for pid in pids:
        rabbit.ctl("close_connection", pid, f"test: cut {service_name} off")


def stays(system: System, observer_id: str, service_name: str, seconds: float) -> None:
    """The observer is Processing on ``service_name`` at every look for ``seconds``."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        obs = system.observer(observer_id)
        assert (obs["status"], obs["service_name"]) == ("Processing", service_name), obs
        time.sleep(0.3)


def test_service_deaths_never_fail_healthy_observers(system: System) -> None:
    """3 services, 30 healthy tickers, 8 kill -9 of random services within 60 s, each
    restarted under its name: default probation settings, and nobody ends Failed."""
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    system.start_manager()
    names = ["svc-a", "svc-b", "svc-c"]
    procs = {name: system.start_service(name, workers=40) for name in names}
    ids = [system.create(f"healthy-{i}", args={"interval_s": 0.5, "emit": False})["id"] for i in range(30)]
    for oid in ids:
        system.wait_status(oid, "Processing", timeout=60)
    began = time.monotonic()
    for _ in range(8):
        name = rng.choice(names)
        procs[name].kill9()
        procs[name] = system.start_service(name, workers=40)
        time.sleep(rng.uniform(0, max(0.0, 60 / 8 - 2)))
    assert time.monotonic() - began < 90
    wait_for(
        lambda: all(system.observer(oid)["status"] == "Processing" for oid in ids),
        120,
        "every healthy observer Processing again",
    )
    observers = [system.observer(oid) for oid in ids]
    assert not [o for o in observers if o["status"] == "Failed"]
    on_probation = [o for o in observers if o["probation"]]
    print(f"{len(on_probation)} of {len(ids)} on probation")
    histories = [event_names(system, oid) for oid in ids]
    assert sum(h.count("host_lost") for h in histories) >= 8
    for history, obs in zip(histories, observers, strict=True):
        assert ("probation" in history) == bool(obs["probation"]) or "probation_ended" in history
    assert system.get("/api/stats").json()["probation"] == len(on_probation)
    assert f"orch_observers_on_probation {float(len(on_probation))}" in system.get("/metrics").text


def test_services_that_come_back_after_a_partition_put_nobody_on_probation(system: System) -> None:
    """A network flap is not a crash: the services lost their sessions, not their processes."""
    # Given a fleet whose network to the broker can be cut, and probation after 2 service deaths
    with Partition.before(system.amqp_url) as network:
        system.start_manager(ORCH_PROBATION_AFTER_HOST_DEATHS="2")
        url = network.url_for(system.amqp_url)
        services = [system.start_service(name, workers=20, ORCH_AMQP_URL=url) for name in ("svc-a", "svc-b")]
        ids = [system.create(f"healthy-{i}", args={"interval_s": 0.5, "emit": False})["id"] for i in range(10)]
        for oid in ids:
            system.wait_status(oid, "Processing")

        # When the whole fleet's network drops everything twice, long enough for the broker
        # to close every service's connection and the manager to judge them lost
        def flap(times: int) -> None:
            lost_before = metric(system, "orch_services_lost_total")
            network.cut()
            wait_for(lambda: metric(system, "orch_services_lost_total") >= lost_before + 2, 60, "both judged lost")
            network.heal()
            wait_for(lambda: all(p.text().count("broker session open") > times for p in services), 60, "back")
            wait_for(
                lambda: system.get("/api/stats").json()["services"] == {"alive": 2, "lost": 0, "deleted": 0},
                60,
                "both alive again",
            )
            wait_for(lambda: all(system.observer(i)["status"] == "Processing" for i in ids), 60, "all running")
            # No wait for a heartbeat: the next cut may come before a service speaks again, and
            # a move away from it applied after it spoke from its new session belongs to the
            # session that ended, not to its next death (``probation._victims``).

        flap(1)
        flap(2)

        # Then each observer's history has both deaths, and none is on probation: both services
        # came back as the same processes, so nothing they ran is suspect
        for oid in ids:
            assert event_names(system, oid).count("host_lost") >= 2, event_names(system, oid)
        observers = [system.observer(oid) for oid in ids]
        assert [o for o in observers if o["probation"]] == [], observers
        assert system.get("/api/stats").json()["probation"] == 0


def test_a_late_stop_aimed_at_an_older_copy_is_ignored(system: System, rabbit: infra.RabbitNode) -> None:
    """X runs on A; the manager is frozen while A's connection drops and A takes X back in a
    new session; a stale start report of B is applied first: the stop it triggers names
    A's old session, so A's new copy (the only one) keeps running."""
    system.start_manager(ORCH_STATE_PROCESS="false")  # one process to freeze
    system.start_service("svc-a", workers=5)
    system.start_service("svc-b", workers=5, ORCH_POOLS="other")  # alive, but never gets X
    b = system.service_by_name("svc-b")
    assert b is not None
    oid = system.create("only-copy", args={"interval_s": 0.5, "emit": False})["id"]
    system.wait_status(oid, "Processing")
    service_a = system.procs[1]

    assert system.manager is not None
    system.manager.signal(signal.SIGSTOP)
    try:
        publish_report(
            system,
            ObserversStarted(
                observer_ids=[uuid.UUID(oid)], service_id=uuid.UUID(b["id"]), session_id=uuid.uuid4(), redelivered=True
            ),
        )
        close_connections(rabbit, "svc-a")
        wait_for(lambda: service_a.text().count(f"observer {oid} (ticker") >= 2, 30, "svc-a to take X back")
    finally:
        system.manager.signal(signal.SIGCONT)
    wait_for(lambda: "aimed at an older copy" in service_a.text(), 30, "svc-a to ignore the stale stop")
    system.wait_status(oid, "Processing")
    stays(system, oid, "svc-a", 3 * 3)  # three inventories (ORCH_INVENTORY_S=3)


def test_a_batch_delivered_again_is_not_applied_twice(system: System) -> None:
    """A start report applied once, then delivered again after the observer moved (the
    manager killed between its commit and its ack): the replay is skipped, not judged a
    move that stops the only live copy."""
    system.start_manager()
    service_a = system.start_service("svc-a", workers=5)
    oid = system.create("moved-once", args={"interval_s": 0.5, "emit": False})["id"]
    system.wait_status(oid, "Processing")
    a = system.service_by_name("svc-a")
    assert a is not None
    # What services send
    replayed = ObserversStarted(
        observer_ids=[uuid.UUID(oid)], service_id=uuid.UUID(a["id"]), session_id=uuid.uuid4(), redelivered=True
    )
    publish_report(system, replayed)  # applied: the same service, nothing changes
    wait_for(lambda: event_names(system, oid).count("started") == 2, 20, "the report applied")

    system.start_service("svc-c", workers=5)
    service_a.signal(signal.SIGSTOP)  # silent past the AMQP heartbeat: the broker moves X to svc-c
    try:
        wait_for(lambda: system.observer(oid)["service_name"] == "svc-c", 30, "X moved to svc-c")
    finally:
        service_a.signal(signal.SIGCONT)
    publish_report(system, replayed)  # the same message id again
    assert system.manager is not None
    manager = system.manager
    wait_for(lambda: "applied before (delivered again)" in manager.text(), 20, "the replay skipped")
    stays(system, oid, "svc-c", 3 * 3)


def test_a_stop_is_reported_before_its_start_is_acked(system: System, rabbit: infra.RabbitNode, vhost: str) -> None:
    """The broker refuses state reports; a stop ends the observer but its report cannot be
    confirmed, and its service is then killed: the start was not acked, so it comes back and
    the stop completes on the next service."""
    system.start_manager()
    service_a = system.start_service("svc-a", workers=5)
    oid = system.create("stopped-once", args={"interval_s": 0.5, "emit": False})["id"]
    system.wait_status(oid, "Processing")
    policy = '{"max-length": 0, "overflow": "reject-publish"}'
    rabbit.ctl("set_policy", "-p", vhost, "--apply-to", "queues", "refuse-state", "^orch\\.state$", policy)
    try:
        assert system.delete(f"/api/observers/{oid}").status_code == 202
        wait_for(lambda: "state publish failed" in service_a.text(), 30, "svc-a unable to report")
        service_a.kill9()
    finally:
        rabbit.ctl("clear_policy", "-p", vhost, "refuse-state")
    system.start_service("svc-b", workers=5)
    system.wait_status(oid, "Deleted", timeout=60)


def test_a_body_that_swallows_cancellation_cannot_act_after_its_stop(with_test_plugin: System, tmp_path: Path) -> None:
    plugged = with_test_plugin
    plugged.start_manager()
    plugged.start_service("svc-a", workers=5)
    log = tmp_path / "ticks.log"
    oid = plugged.create("stubborn-1", kind="stubborn", args={"interval_s": 0.1, "log_file": str(log)})["id"]
    plugged.wait_status(oid, "Processing")
    wait_for(lambda: len(read_ticks(log)) >= 3, 20, "ticks")
    assert plugged.delete(f"/api/observers/{oid}").status_code == 202
    plugged.wait_status(oid, "Deleted", timeout=30)
    ticks = len(read_ticks(log))
    time.sleep(2)  # twenty intervals: it would have ticked on by now
    assert len(read_ticks(log)) == ticks


def test_a_service_the_manager_forgot_introduces_itself_again(system: System) -> None:
    """The database loses a live service's row (restored from an older backup, or its
    ServiceBorn was lost): its next heartbeat makes the manager ask, it sends ServiceBorn
    again, and its inventory puts its observers back on it."""
    system.start_manager()
    system.start_service("svc-a", workers=5)
    svc = system.service_by_name("svc-a")
    assert svc is not None
    oid = system.create("kept", args={"interval_s": 0.5, "emit": False})["id"]
    system.wait_status(oid, "Processing")
    sql(
        system.database_url,
        "UPDATE observers SET service_id = NULL, status = 'Created' WHERE service_id = $1",
        uuid.UUID(svc["id"]),
    )
    sql(system.database_url, "DELETE FROM services WHERE id = $1", uuid.UUID(svc["id"]))
    wait_for(lambda: system.service_by_name("svc-a") is not None, 30, "svc-a known again")
    obs = system.wait_status(oid, "Processing")
    assert obs["service_id"] == svc["id"]


@pytest.mark.parametrize("start_queues", [1, 3], ids=["one-start-queue", "three-start-queues"])
def test_the_broker_rebuilt_from_the_database(
    with_test_plugin: System, rabbit: infra.RabbitNode, vhost: str, tmp_path: Path, start_queues: int
) -> None:
    """200 observers on 3 services; the broker loses everything (the test's vhost deleted
    and made again: every queue, message and connection gone, as on a reset node). The
    manager finds its marker missing and publishes every start again from the database:
    each runs again on one service, stops requested meanwhile reach Deleted, counts match.
    Over three start queues too: the services consume all three again. No process logs an ERROR:
    a question the broker refused while the vhost was made again once left one (CI)."""
    system = with_test_plugin
    system.start_manager(ORCH_START_QUEUES=str(start_queues))
    for name in ("svc-a", "svc-b", "svc-c"):
        system.start_service(name, workers=100)
    log = tmp_path / "ticks.log"
    ids = [system.create(f"kept-{i}", kind="probe", args=probe_args(log, interval_s=1.0))["id"] for i in range(200)]
    for oid in ids:
        system.wait_status(oid, "Processing", timeout=60)

    said_before = {proc.name: len(proc.text()) for proc in system.procs}  # the test plug-in's broken kind
    rabbit.delete_vhost(vhost)
    rabbit.add_vhost(vhost)
    lost = time.monotonic()
    stopped = ids[:20]

    def stop_accepted(oid: str) -> bool:  # answered 503 until the manager is connected again
        return system.delete(f"/api/observers/{oid}").status_code == 202

    for oid in stopped:
        wait_for(functools.partial(stop_accepted, oid), 60, f"the stop of {oid} accepted")

    manager = system.manager
    assert manager is not None
    wait_for(lambda: "start(s) again from the database" in manager.text(), 60, "a rebuild")
    kept = ids[20:]
    wait_for(
        lambda: (
            all(system.observer(oid)["status"] == "Deleted" for oid in stopped)
            and all(system.observer(oid)["status"] == "Processing" for oid in kept)
        ),
        120,
        "every observer back, every stop done",
    )
    print(f"converged {time.monotonic() - lost:.1f}s after the broker lost its data")
    wait_for(
        lambda: sum(s["running"] for s in system.services() if s["status"] == "alive") == len(kept), 30, "inventories"
    )
    stats = system.get("/api/stats").json()
    assert stats["observers"]["Processing"] == len(kept) and stats["observers"]["Deleted"] == len(stopped)
    time.sleep(2)  # a few ticks of everyone on its new service
    assert_never_on_two_services(log)

    # Every queue is consumed again and holds nothing: the queues past the first are the
    # manager's to declare, and a service asks for them each second until it finds them (one
    # may take a full share meanwhile, and a full service consumes nothing).
    def consumed_and_empty(queue: str) -> bool:
        ready, consumers = system.queue_counts(queue)
        return ready == 0 and consumers >= 1

    for queue in topology.start_queue_names("default", start_queues):
        wait_for(functools.partial(consumed_and_empty, queue), 60, f"{queue} consumed and empty")
    # The loss is told in the product's words (the rebuild's WARNING, each session's end):
    # the libraries' records of the closed connections are not ERRORs (shared/logs.py)
    for proc in system.procs:
        text = proc.text()[said_before.get(proc.name, 0) :]
        assert "Traceback" not in text and " ERROR [" not in text, f"{proc.name}: {text[-4000:]}"
        if proc.name.startswith("svc-"):  # its one session ended by the loss, and no other since
            assert text.count("broker session lost") == 1, f"{proc.name}: {text[-4000:]}"


def test_a_database_restored_from_an_older_backup_loses_no_running_observer(system: System) -> None:
    """Rows lost as by a restore from before they were created: the observers still run,
    so they are adopted from their start messages where they run; one whose create the
    client was told failed (abandoned) is stopped instead."""
    system.start_manager()
    service = system.start_service("svc-a", workers=5)
    kept = system.create("kept-after-restore", args={"interval_s": 0.5, "emit": False})
    abandoned = system.create("told-failed", args={"interval_s": 0.5, "emit": False})
    for obs in (kept, abandoned):
        system.wait_status(obs["id"], "Processing")
    for table, column in (("observers", "id"), ("observer_events", "observer_id")):  # a restore loses both
        sql(
            system.database_url,
            f"DELETE FROM {table} WHERE {column} = ANY($1::uuid[])",
            [uuid.UUID(kept["id"]), uuid.UUID(abandoned["id"])],
        )
    sql(system.database_url, "INSERT INTO abandoned_observers (observer_id) VALUES ($1)", uuid.UUID(abandoned["id"]))

    wait_for(lambda: system.get(f"/api/observers/{kept['id']}").status_code == 200, 60, "adopted")
    adopted = system.wait_status(kept["id"], "Processing")
    assert adopted["service_name"] == "svc-a" and adopted["name"] == "kept-after-restore"
    assert event_names(system, kept["id"]) == ["adopted"]
    assert service.text().count(f"observer {kept['id']} (") == 1  # never restarted
    wait_for(lambda: "its create was answered 503" in service.text(), 30, "the abandoned one stopped")
    assert system.get(f"/api/observers/{abandoned['id']}").status_code == 404
    stats = system.get("/api/stats").json()
    assert stats["observers"]["Processing"] == 1


def test_two_services_started_under_one_name_both_serve(system: System) -> None:
    """The second one born under a live one's name replaces it in the manager's view (as a
    restart would); the first still runs and heartbeats, so it is asked to take a name of
    its own, and its observers come back to it instead of staying Created."""
    system.start_manager()
    first = system.start_service("same-host", workers=5)
    ids = [system.create(f"on-first-{i}", args={"interval_s": 0.5, "emit": False})["id"] for i in range(3)]
    for oid in ids:
        system.wait_status(oid, "Processing")
    system.start_service("same-host", workers=5, wait=False)

    def both_alive() -> bool:
        return len([s for s in system.services() if s["status"] == "alive"]) == 2

    wait_for(both_alive, 30, "both services alive")
    names = sorted(s["name"] for s in system.services() if s["status"] == "alive")
    assert names[0] == "same-host" and names[1].startswith("same-host-"), names
    assert "this one is 'same-host-" in first.text()
    wait_for(lambda: all(system.observer(oid)["status"] == "Processing" for oid in ids), 30, "observers back")
    assert {system.observer(oid)["service_name"] for oid in ids} == {names[1]}


def test_a_stop_that_names_an_observer_twice_stops_it_once_and_the_session_lives(system: System) -> None:
    """One batch of state reports can decide the same stop twice (after the broker lost its
    data, a service's start report and its inventory both name an OnDeleting observer), and
    the merged command then names it twice. Acked twice, its start's second ack was an
    unknown delivery tag: the broker closed the channel, the session ended, and every other
    observer of the service was fenced (seen in test_the_broker_rebuilt_from_the_database)."""
    system.start_manager()
    service = system.start_service("svc-a", workers=5)
    ids = [system.create(f"bystander-{i}", args={"interval_s": 0.5, "emit": False})["id"] for i in range(4)]
    for oid in ids:
        system.wait_status(oid, "Processing")
    target = uuid.UUID(ids[0])
    stop = StopObservers(
        observer_ids=[target, target], service_id=uuid.UUID(system.observer(ids[0])["service_id"]), reason="test: twice"
    )
    system.publish_raw("", stop.encode(), exchange=topology.CONTROL_EXCHANGE)
    wait_for(lambda: "stopped (test: twice)" in service.text(), 20, "the stop done")
    time.sleep(2)  # the broker's answer to a bad ack closes the channel at once
    text = service.text()
    assert "1 observer(s) stopped (test: twice)" in text, text[-3000:]
    assert "broker session lost" not in text and "fenced" not in text, text[-3000:]
    for oid in ids[1:]:
        assert system.observer(oid)["status"] == "Processing"


@pytest.mark.parametrize("start_queues", [1, 3], ids=["one-start-queue", "three-start-queues"])
def test_a_row_whose_start_is_in_no_queue_gets_it_again(system: System, start_queues: int) -> None:
    """The only copy is stopped behind the manager's back (a stop the rules did not send:
    the start is acked, the manager still thinks it should run): its inventory makes the row
    Created, its pool's queues stay empty, so its start is published again."""
    system.start_manager(ORCH_LOST_START_AFTER_S="3", ORCH_START_QUEUES=str(start_queues))
    service = system.start_service("svc-a", workers=5)
    oid = system.create("acked-away", args={"interval_s": 0.5, "emit": False})["id"]
    obs = system.wait_status(oid, "Processing")
    stop = StopObservers(observer_ids=[uuid.UUID(oid)], service_id=uuid.UUID(obs["service_id"]), reason="test: gone")
    system.publish_raw("", stop.encode(), exchange=topology.CONTROL_EXCHANGE)
    wait_for(lambda: "stopped (test: gone)" in service.text(), 20, "the only copy stopped and acked")
    system.wait_status(oid, "Created", timeout=20)  # its service's inventory no longer lists it
    manager = system.manager
    assert manager is not None
    wait_for(lambda: "start(s) that were in no queue" in manager.text(), 30, "its start published again")
    system.wait_status(oid, "Processing", timeout=30)


def test_a_hand_over_delivered_again_is_not_applied_twice(system: System) -> None:
    """A service hands X over and the broker gives it back to the same service, in the same
    session (issue 62, item 4). The hand-over report delivered again (a new leader, a channel
    lost before the ack) is skipped: applied, it would take the copy running there off its service."""
    system.start_manager()
    system.start_service("svc-a", workers=5)
    oid = system.create("handed-back", args={"interval_s": 0.5, "emit": False})["id"]
    system.wait_status(oid, "Processing")
    a = system.service_by_name("svc-a")
    assert a is not None
    held_in = sql(system.database_url, "SELECT host_session_id FROM observers WHERE id = $1", uuid.UUID(oid))
    assert isinstance(held_in, uuid.UUID)
    handed = ObserversHandedOver(
        service_id=uuid.UUID(a["id"]), session_id=held_in, observer_ids=[uuid.UUID(oid)], reason="even load"
    )
    publish_report(system, handed)  # applied: with no service until svc-a's inventory says it runs there
    wait_for(lambda: "released" in event_names(system, oid), 20, "the hand-over applied")
    wait_for(lambda: system.observer(oid)["service_name"] == "svc-a", 30, "Processing on svc-a again")

    publish_report(system, handed)  # the same message id again
    assert system.manager is not None
    manager = system.manager
    wait_for(lambda: "applied before (delivered again)" in manager.text(), 20, "the replay skipped")
    assert event_names(system, oid).count("released") == 1
    stays(system, oid, "svc-a", 3)
