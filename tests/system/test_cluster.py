"""A RabbitMQ cluster of the default series on this machine (``BROKER_NODES=3``,
``tools/infra/cluster.py``): three nodes form one cluster, a quorum queue keeps its messages
and serves clients when the node its client used is killed, and the killed node rejoins; the
product on it (``ORCH_QUEUE_TYPE=quorum``) loses nothing and runs nothing twice when each node
is killed in turn (docs/design.md, "On a RabbitMQ cluster")."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import aio_pika
import pytest

from shared import topology
from tests.system.test_fencing import assert_never_on_two_services
from tools import infra
from tools.harness import Proc, System, probe_args, read_ticks, unique, wait_for


def running_nodes(node: infra.RabbitNode) -> list[str]:
    said = node.ctl("cluster_status", "--formatter", "json")
    return list(json.loads(said[said.index("{") :])["running_nodes"])


async def _publish(url: str, queue: str, bodies: list[bytes]) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
        for body in bodies:
            await channel.default_exchange.publish(aio_pika.Message(body, delivery_mode=2), routing_key=queue)


async def _take(url: str, queue: str, count: int) -> list[bytes]:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        q = await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
        taken = []
        for _ in range(count):
            message = await q.get(timeout=10, fail=True)
            assert message is not None
            await message.ack()
            taken.append(message.body)
        await q.delete(if_unused=False, if_empty=False)
        return taken


def test_a_cluster_of_three_keeps_a_quorum_queue_through_a_node_killed() -> None:
    nodes = infra.broker_cluster(3)
    assert sorted(running_nodes(nodes[1])) == sorted(n.node for n in nodes)
    queue = f"cluster-test-{uuid.uuid4().hex[:8]}"
    asyncio.run(_publish(nodes[0].url, queue, [b"one", b"two"]))
    nodes[0].kill()
    try:
        wait_for(lambda: len(running_nodes(nodes[1])) == 2, 60, "the others to see the node gone")
        asyncio.run(_publish(nodes[1].url, queue, [b"three"]))  # a majority serves the queue
        assert asyncio.run(_take(nodes[2].url, queue, 3)) == [b"one", b"two", b"three"]
    finally:
        nodes[0].start()
    wait_for(lambda: len(running_nodes(nodes[0])) == 3, 60, "the killed node to rejoin")


SERVICE_DEATHS = 25  # past 4.3's default delivery limit of 20


async def _hold_and_die(url: str, queue: str) -> None:
    """Take the start as a service does (prefetch 1, ``HELD_FOR_GOOD``, no ack), then close the
    connection holding it: RabbitMQ counts that as a failed delivery, as it does a service's death."""
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=1)
    held: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def take(_message: aio_pika.abc.AbstractIncomingMessage) -> None:
        if not held.done():
            held.set_result(None)

    q = await channel.get_queue(queue, ensure=False)
    await q.consume(take, arguments=topology.HELD_FOR_GOOD)
    await asyncio.wait_for(held, 10)
    await connection.close()


async def _hold_through_deaths(urls: list[str], pool: str) -> tuple[int, int]:
    """(messages left in the start queue, in its error queue) after ``SERVICE_DEATHS`` holders
    died holding its one start."""
    connection = await aio_pika.connect(urls[0])
    async with connection:
        channel = await connection.channel()
        await topology.declare_common(channel, "quorum")
        queue = await topology.declare_start_queue(channel, pool, "quorum")
        await channel.default_exchange.publish(topology.persistent(b"{}"), routing_key=queue.name)
        for i in range(SERVICE_DEATHS):
            await _hold_and_die(urls[i % len(urls)], queue.name)
        error = await channel.get_queue(topology.error_queue_name(queue.name), ensure=False)
        # The last holder's close reaches the queue's leader on another node a moment later:
        # until then the start is counted nowhere (a CI run saw (0, 0)).
        deadline = time.monotonic() + 10
        while True:
            left = (await queue.declare()).message_count or 0
            dead = (await error.declare()).message_count or 0
            if left + dead or time.monotonic() > deadline:
                return left, dead
            await asyncio.sleep(0.1)


def test_a_held_start_outlives_more_service_deaths_than_the_delivery_limit() -> None:
    """A quorum start queue as the product declares it keeps a start whose holders died 25
    times (4.3 drops or dead-letters it after 20 by default): the 1,000 failovers of a
    long-lived observer drop nothing."""
    nodes = infra.broker_cluster(3)
    vhost = unique("dl")
    nodes[0].add_vhost(vhost)
    try:
        left, dead = asyncio.run(_hold_through_deaths([n.url_for(vhost) for n in nodes], "default"))
    finally:
        nodes[0].delete_vhost(vhost)
    assert (left, dead) == (1, 0)


# --- the product on the cluster ------------------------------------------------------------------

COUNT = 300


@pytest.fixture
def on_cluster(database: str, plugin_path: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    yield from fleet_on_cluster(database, plugin_path, tmp_path, request)


def fleet_on_cluster(
    database: str, plugin_path: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Fleet]:
    """A manager and three services on a vhost of its own on the 3-node cluster, with quorum
    queues; service i starts at node i (as ``make run`` starts them on a cluster) and stays
    where a failure moves it (``test_home_node`` tests the return). The body of a fixture
    (``on_cluster`` here; ``test_cluster_partition`` has its own)."""
    nodes = infra.broker_cluster(3)
    vhost = unique("c")
    nodes[0].add_vhost(vhost)
    urls = [node.url_for(vhost) for node in nodes]
    system = System(amqp_url=urls[0], database_url=database, workdir=tmp_path)
    system.env = {
        "ORCH_QUEUE_TYPE": "quorum",
        "ORCH_AMQP_URLS": ",".join(urls),
        "ORCH_BROKER_METRICS_URLS": ",".join(node.metrics_url for node in nodes),
        "ORCH_AMQP_HOME": "first",
        "ORCH_AMQP_RETURN_HOME_AFTER_S": "0",
        "PYTHONPATH": str(plugin_path),
    }
    yield Fleet(system, nodes, urls)
    system.stop_all()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(system.logs())
    for node in nodes:
        if not node.is_running():
            node.start()
    nodes[0].delete_vhost(vhost)


@dataclass
class Fleet:
    system: System
    nodes: list[infra.RabbitNode]
    urls: list[str]

    def start(self, tick_log: Path, count: int = COUNT) -> tuple[list[Proc], list[str]]:
        """Three services of ``room(count)`` workers each, and ``count`` probes in one bulk create."""
        self.system.start_manager()
        services = []
        for i in range(3):
            rotated = ",".join(self.urls[i:] + self.urls[:i])
            services.append(self.system.start_service(f"svc-{i}", workers=room(count), ORCH_AMQP_URLS=rotated))
        specs = [{"name": f"q-{i}", "kind": "probe", "args": probe_args(tick_log, 0.5)} for i in range(count)]
        answer = self.system.post("/api/observers/bulk", {"observers": specs})
        assert answer.status_code == 201, answer.text
        return services, [item["id"] for item in answer.json()["items"]]

    def all_processing_on_alive(self, ids: list[str]) -> bool:
        alive = {s["id"] for s in self.system.services() if s["status"] == "alive"}
        observers = {o["id"]: o for o in self.system.observers()}
        return all(observers[i]["status"] == "Processing" and observers[i]["service_id"] in alive for i in ids)


def room(count: int) -> int:
    """Workers per service: twice the load, so no service is ever full. A full one rightly
    holds no consumer (``observer_service/start_consumers.py``), and these tests check that
    every service consumes again after a fault. A fleet taken back at once by one service
    (all of it redelivered while the others were still reconnecting) would otherwise be."""
    return 2 * count


def ticking_since(log: Path, ids: list[str], since: float) -> bool:
    """Every observer of ``ids`` ticked after ``since`` (it runs somewhere again)."""
    last: dict[str, float] = {}
    for observer, _service, _pid, at in read_ticks(log):
        last[observer] = max(at, last.get(observer, 0.0))
    return all(last.get(oid, 0.0) > since for oid in ids)


def consuming_services(fleet: Fleet) -> set[str]:
    """The services with a consumer on the default pool's start queue, by their holding
    connection's name (rabbitmqctl lists every node's consumers, channels and connections).
    New creates no longer show it: they go to the emptiest services first (placement)."""
    node = next(n for n in fleet.nodes if n.is_running())
    vhost = unquote(urlsplit(fleet.system.amqp_url).path.lstrip("/"))
    queue = topology.start_queue_name("default")

    def rows(*args: str) -> list[list[str]]:
        return [line.split("\t") for line in node.ctl("-q", *args, "--no-table-headers").splitlines()]

    channels = {row[1] for row in rows("list_consumers", "-p", vhost, "queue_name", "channel_pid") if row[0] == queue}
    connections = {row[1] for row in rows("list_channels", "pid", "connection") if row[0] in channels}
    named = (
        re.search(r"observer-service (svc-\d+)\b(?! \(publish\))", " ".join(row))
        for row in rows("list_connections", "pid", "client_properties")
        if row[0] in connections
    )
    return {m.group(1) for m in named if m}


def kill_and_restart(fleet: Fleet, node: infra.RabbitNode, service: Proc, ids: list[str], ticks: Path) -> None:
    """``kill -9`` of ``node`` (``service``'s): the service opens a session on another node,
    every observer runs again (ticks after the kill) and is Processing on an alive service,
    and the node rejoins once restarted."""
    assert f"broker session open on 127.0.0.1:{node.port}" in service.text()
    opened = service.text().count("broker session open on")
    killed_at = time.time()
    node.kill()
    wait_for(lambda: service.text().count("broker session open on") > opened, 60, f"{service.name} to reconnect")
    wait_for(lambda: ticking_since(ticks, ids, killed_at + 1), 120, f"all running again with {node.node} down")
    wait_for(lambda: fleet.all_processing_on_alive(ids), 120, f"all Processing with {node.node} down")
    node.start()
    wait_for(lambda: len(running_nodes(node)) == 3, 120, f"{node.node} to rejoin")


def test_each_node_killed_in_turn_loses_no_observer_and_runs_none_twice(on_cluster: Fleet, tmp_path: Path) -> None:
    """300 observers on 3 services, each connected to a different node; each node killed with
    ``kill -9`` in its own round (the first holds the manager's connection), then restarted:
    every round ends with all 300 Processing, never on two services at once (per-tick records),
    and every service consumes the start queue again at the end."""
    ticks = tmp_path / "ticks.log"
    services, ids = on_cluster.start(ticks)
    system = on_cluster.system
    wait_for(lambda: on_cluster.all_processing_on_alive(ids), 120, "all Processing")
    # Each read every node's net_ticktime (deploy/rabbitmq/cluster.conf's), which the give-up fits.
    for service in services:
        said = service.text()
        assert all(f"broker net_ticktime is 20 s at {node.metrics_url}" in said for node in on_cluster.nodes), said
        assert "lease give-up lowered" not in said
    for node, service in zip(on_cluster.nodes, services, strict=True):
        kill_and_restart(on_cluster, node, service, ids, ticks)
    assert_never_on_two_services(ticks)
    late = [system.create(f"late-{i}", kind="probe", args=probe_args(ticks, 0.5))["id"] for i in range(30)]
    wait_for(lambda: on_cluster.all_processing_on_alive(late), 60, "new creates Processing")
    wait_for(lambda: consuming_services(on_cluster) == {"svc-0", "svc-1", "svc-2"}, 30, "every service consuming")


def test_a_pool_over_three_start_queues_spreads_their_leaders_and_loses_nothing_to_a_node_killed(
    on_cluster: Fleet, tmp_path: Path
) -> None:
    """``ORCH_START_QUEUES=3`` (docs/design.md, "A pool over several start queues"): the pool's
    three queues lead on three different nodes, and the node that leads the first and holds
    svc-0's connection killed with ``kill -9`` loses nothing and runs nothing twice."""
    on_cluster.system.env["ORCH_START_QUEUES"] = "3"
    ticks = tmp_path / "ticks.log"
    services, ids = on_cluster.start(ticks)
    wait_for(lambda: on_cluster.all_processing_on_alive(ids), 120, "all Processing")
    vhost = unquote(urlsplit(on_cluster.system.amqp_url).path.lstrip("/"))
    listing = on_cluster.nodes[0].ctl("-q", "list_queues", "-p", vhost, "name", "leader", "--no-table-headers")
    leaders = dict(line.split("\t")[:2] for line in listing.splitlines())
    starts = [leaders[topology.start_queue_name("default", index)] for index in range(3)]
    assert len(set(starts)) == 3, leaders
    kill_and_restart(on_cluster, on_cluster.nodes[0], services[0], ids, ticks)
    assert_never_on_two_services(ticks)
    wait_for(lambda: consuming_services(on_cluster) == {"svc-0", "svc-1", "svc-2"}, 30, "every service consuming")


def layout(log: Path, since: float) -> dict[str, str]:
    """Each observer's service by its last tick after ``since``."""
    last: dict[str, tuple[float, str]] = {}
    for observer, service, _pid, at in read_ticks(log):
        if at > since and at >= last.get(observer, (0.0, ""))[0]:
            last[observer] = (at, service)
    return {observer: service for observer, (_at, service) in last.items()}


def test_a_node_death_gives_the_emptied_service_its_starts_back_before_the_manager_can_say_so(
    on_cluster: Fleet, tmp_path: Path
) -> None:
    """svc-1's node killed with the manager stopped (SIGSTOP), so no placement of the balancer
    follows the death: the starts svc-1 held come back to svc-1 alone, because a service whose
    session ended, having fenced everything, consumes under its share on its own
    (docs/design.md, "Even load"); the others keep what they run. Before, all three consumed
    at one priority and the returning starts spread over them, to be evened later by hand-overs
    (a second interruption for observers that ran fine)."""
    ticks = tmp_path / "ticks.log"
    count = 150
    services, ids = on_cluster.start(ticks, count)
    system = on_cluster.system
    wait_for(lambda: on_cluster.all_processing_on_alive(ids), 120, "all Processing")

    # Even within the balancer's tolerance and still for 3 s: all three at the same priority.
    def settled() -> dict[str, str] | None:
        now = time.time()
        seen = layout(ticks, now - 1)
        if len(seen) < count:
            return None
        time.sleep(3)
        if layout(ticks, time.time() - 1) != seen:
            return None
        loads = [list(seen.values()).count(s) for s in set(seen.values())]
        return seen if len(loads) == 3 and max(abs(n - count / 3) for n in loads) <= 0.1 * count / 3 else None

    before = wait_for(settled, 120, "the fleet even and still")
    assert before is not None
    victim = system.service_by_name("svc-1")
    assert victim is not None
    manager = system.procs[0]
    state = manager.state_process()
    assert state is not None
    frozen = [manager.popen.pid, state]  # its API, and the state process that balances
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        node, service = on_cluster.nodes[1], services[1]
        assert f"broker session open on 127.0.0.1:{node.port}" in service.text()
        opened = service.text().count("broker session open on")
        killed_at = time.time()
        node.kill()
        wait_for(lambda: service.text().count("broker session open on") > opened, 60, "svc-1 to reconnect")
        wait_for(lambda: ticking_since(ticks, ids, killed_at + 1), 120, "all running again")
        after = layout(ticks, killed_at + 1)
        moved = {oid: (before[oid], after[oid]) for oid in ids if before[oid] != after[oid]}
        assert not moved, f"{len(moved)} observer(s) came back elsewhere; svc-1 is {victim['id']}: {moved}"
        assert "runs nothing since its session ended" in service.text()
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    wait_for(lambda: on_cluster.all_processing_on_alive(ids), 120, "all Processing once the manager is back")
    node.start()
    wait_for(lambda: len(running_nodes(node)) == 3, 120, f"{node.node} to rejoin")
    assert_never_on_two_services(ticks)
