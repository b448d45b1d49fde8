"""``python -m bench.cluster`` (``make bench-cluster``): the product on the 3-node cluster next
to one node, in the same run (issue 55), and the broker's disk after many failovers.

For each deployment (one node with classic queues; the 3-node cluster of ``BROKER_NODES=3``
with quorum queues, service i starting at node i; the cluster again with the pool spread over
``--start-queues`` queues, 3 by default, ``ORCH_START_QUEUES``): a manager and three services, then
* ``create``: N idle observers in bulk requests of 1,000, until all are Processing;
* ``service kill``: ``kill -9`` of the busiest service, until its share is Processing on the
  others (the service is then started again under its name);
* ``node kill`` (cluster only), once the balancer has evened the fleet again (each service a
  third, within 15 %): ``kill -9`` of the node the busiest service is connected to
  (never the manager's), until no observer is held by that service's old broker session and
  all are Processing; the node is then started again and rejoins.
* ``node cut`` (cluster only): the same with the node of the busiest service (never the
  manager's) cut off from the other two (``tools/infra/partition.py``), then healed.

Then, on the cluster, the broker's half (``bench/cluster_failovers.py``): each node's memory
per start held in a quorum start queue, and its disk after F failovers of H held starts.

    python -m bench.cluster                      # N = 30,000; 1,000 failovers of 1,000 starts
    python -m bench.cluster --size 3000 --failovers 100
    python -m bench.cluster --only failovers     # the memory and the failovers alone
    python -m bench.cluster --only cluster --size 100000   # the cluster, 1 and 3 start queues
    python -m bench.cluster --only cluster --start-queues 1 --profile   # py-spy the node kill's hand-on

Prints the figures side by side and writes ``bench/results/cluster-<time>.json``. Two targets,
issue 65's: a node's death costs at most 3 s until every observer runs again
(``node_kill_running_s``: the services' own count on ``/metrics`` back to N, timed to the
latest start as ``orch_service_last_start_timestamp_seconds`` says, so the poll adds
nothing), and a node cut off at most 30 s (``node_cut_s``) until the manager's view agrees.
The node kill is also timed until the manager's view agrees (``node_kill_s``), which comes
after the observers run.
Beside it, once per run, the raw broker's part (``bench/node_death_raw.py``: a third of N
held on a node killed, taken by two consumers in processes of their own on the other two,
nothing of the product running), scaled to the count each deployment moved
(``node_kill_raw_s``); and the cores each part used over each hand-on (``node_kill_cores``,
``bench/cpu_timeline.py``), which show who was busy: after the 2 s timer, the consumers'
parsing, not the broker (docs/design.md, "What the second after T is made of").
The other figures are judged against one node's. On the cluster, each start queue's leader
and the reductions of its process during the create and the node kill show whether the work
of a pool over several queues is spread (``bench/leader_work.py``): on one 2-core machine
that hosts all three nodes, the seconds cannot show it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench import leader_work, node_death_raw, profile
from bench.cluster_failovers import failovers, print_failovers
from bench.cpu_timeline import CpuTimeline, cores_line
from bench.figures import samples
from bench.fresh import busiest_host, create_idle, fresh_system, held_by
from bench.results_file import RESULTS, results_path, stamp, write_results
from bench.scale import SCALE_ENV
from bench.scenarios import BULK, LAST_START, RUNNING
from shared import topology
from tools import infra
from tools.harness import Proc, System, free_port
from tools.infra import partition

CONSUMES = "orch_service_start_consumes_total"
HANDOVERS = "orch_handovers_total{"
_POLL_S = 0.25
_EVEN_WITHIN = 0.15  # of a service's third: the balancer stops within ORCH_BALANCE_TOLERANCE (0.1)
_EVEN_WITHIN_S = 240.0  # 10,000 handed to a service started empty at 250/s take 40 s
_SETTLED_S = 3.0  # the same counts this long: the balancer (a round a second) has stopped
# Issue 65: a node's kill -9 until every observer of its services runs again.
NODE_DEATH_TARGET_S = 3.0
# And a node cut off from the others until the majority runs its services' observers.
PARTITION_TARGET_S = 30.0
_ON_SESSION = "SELECT EXISTS (SELECT FROM observers WHERE host_session_id = $1)"
# Enough starts for each node's memory per start to stand above the noise of its baseline.


@dataclass
class Deployment:
    name: str
    start_queues: int = 1
    create_per_s: float = 0.0
    create_consumes: int = 0  # consumers the services opened on start queues meanwhile
    service_kill_s: float = 0.0
    service_kill_moved: int = 0
    node_kill_s: float | None = None
    node_kill_running_s: float | None = None
    node_kill_moved: int | None = None
    # The raw broker's part of the node kill at ``node_kill_moved`` (``bench/node_death_raw.py``,
    # measured once per run at a third of the size, scaled at its hand-on rate).
    node_kill_raw_s: float | None = None
    # The cores each part used from the broker's timer to the last start (``bench/cpu_timeline.py``).
    node_kill_cores: dict[str, Any] = field(default_factory=dict)
    # Hand-overs the balancer asked for from the kill until the manager agreed: each is one
    # more interruption, on top of the failover, for an observer that was running.
    node_kill_handovers: int | None = None
    node_cut_s: float | None = None
    node_cut_moved: int | None = None
    # Cluster only: each start queue's leader and its work (``bench/leader_work.py``) during
    # the create and during the node kill.
    leader_work: dict[str, dict[str, dict[str, object]]] = field(default_factory=dict)


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    while True:
        if await check():
            return
        await asyncio.sleep(_POLL_S)


async def all_processing(db: asyncpg.Connection, size: int) -> None:
    async def done() -> bool:
        return int(await db.fetchval("SELECT count(*) FROM observers WHERE status = 'Processing'")) >= size

    await until(done)


async def evened(system: System, size: int, services: int = 3) -> list[int]:
    """Wait (at most ``_EVEN_WITHIN_S``) until each live service runs its third of the fleet,
    within ``_EVEN_WITHIN`` of it (the balancer evens to ``ORCH_BALANCE_TOLERANCE``, 10 %), and
    the counts have not moved for ``_SETTLED_S``, so a node's death costs the share issue 65
    names, a third, not whatever the step before left (a service killed and started again,
    empty), and no hand-over is in flight at it; the counts, as the broker's fleet had them."""
    db = await asyncpg.connect(system.database_url.replace("+asyncpg", ""))
    try:
        fair = size / services

        async def counts() -> list[int]:
            rows = await db.fetch(
                "SELECT count(*) AS n FROM observers o JOIN services s ON s.id = o.service_id "
                "WHERE o.status = 'Processing' AND s.status = 'alive' GROUP BY s.id"
            )
            return sorted((int(r["n"]) for r in rows), reverse=True)

        seen: dict[str, Any] = {"counts": None, "since": 0.0}

        async def even() -> bool:
            # Even, and the same counts for _SETTLED_S: the balancer has stopped moving, so no
            # hand-over is under way when the node is killed.
            now = await counts()
            if now != seen["counts"]:
                seen.update(counts=now, since=time.monotonic())
            fair_each = len(now) == services and all(abs(n - fair) <= _EVEN_WITHIN * fair for n in now)
            return fair_each and time.monotonic() - seen["since"] >= _SETTLED_S

        try:
            async with asyncio.timeout(_EVEN_WITHIN_S):
                await until(even)
        except TimeoutError:
            print(f"  not even after {_EVEN_WITHIN_S:.0f} s: {await counts()}", flush=True)
        return await counts()
    finally:
        await db.close()


async def handed_on(db: asyncpg.Connection, session: object, size: int) -> None:
    """Until no observer is held by the broker session ``session`` and all are Processing."""

    async def moved() -> bool:
        return not await db.fetchval(_ON_SESSION, session)

    await until(moved)
    await all_processing(db, size)


async def create(system: System, size: int) -> float:
    """Observers per second, from the first request until all are Processing."""
    db = await asyncpg.connect(system.database_url.replace("+asyncpg", ""))
    try:
        began = time.monotonic()
        await create_idle(system.base_url, size, "c-", BULK)
        await all_processing(db, size)
        return size / (time.monotonic() - began)
    finally:
        await db.close()


async def handovers(system: System) -> int:
    """The hand-overs the manager's balancer has asked for so far, for any reason
    (``orch_handovers_total`` on the API's ``/metrics``)."""
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(system.base_url + "/metrics")).text
    return int(sum(value for name, value in samples(text) if name.startswith(HANDOVERS)))


async def service_metrics(ports: dict[str, int]) -> list[tuple[str, float]]:
    """Every sample of the services at these metrics ports (a service that does not answer:
    none of its own)."""
    found: list[tuple[str, float]] = []
    async with httpx.AsyncClient(timeout=5) as http:
        for port in ports.values():
            try:
                text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
            except httpx.HTTPError:
                continue
            found.extend(samples(text))
    return found


async def running_by_their_count(ports: dict[str, int]) -> tuple[float, float]:
    """What the services at these metrics ports run by their own count, summed, and the Unix
    time of the latest start among them."""
    found = await service_metrics(ports)
    running = sum(value for name, value in found if name == RUNNING)
    return running, max((value for name, value in found if name == LAST_START), default=0.0)


async def start_consumes(ports: dict[str, int]) -> float:
    """Consumers the services opened on start queues so far, summed."""
    return sum(value for name, value in await service_metrics(ports) if name == CONSUMES)


async def service_kill(system: System, services: list[Proc], ports: dict[str, int], size: int) -> tuple[float, int]:
    """Seconds from the busiest service's ``kill -9`` until its share runs elsewhere."""
    db = await asyncpg.connect(system.database_url.replace("+asyncpg", ""))
    try:
        host = await busiest_host(db)
        victim = next(p for p in services if p.popen.pid == host["pid"])
        began = time.monotonic()
        victim.kill9()

        async def moved() -> bool:
            return await held_by(db, host["service_id"]) == 0

        await until(moved)
        await all_processing(db, size)
        seconds = time.monotonic() - began
    finally:
        await db.close()
    services[services.index(victim)] = await asyncio.to_thread(_start, system, victim.name, size, ports)
    return seconds, int(host["n"])


async def node_kill(
    system: System,
    nodes: list[infra.RabbitNode],
    ports: dict[str, int],
    size: int,
    profiled: tuple[Path, dict[str, int]] | None = None,
) -> tuple[float, float, int, dict[str, Any], int]:
    """Seconds from the ``kill -9`` of the node of the busiest service that is not on the
    manager's node until every observer runs again (the services' own count), and until no
    observer is held by that service's old broker session and all are Processing; how many
    that service held, the cores each part used over the hand-on (from the broker's timer
    to the last start), and the hand-overs the balancer asked for meanwhile."""
    db = await asyncpg.connect(system.database_url.replace("+asyncpg", ""))
    timeline, sampling = CpuTimeline(), None
    try:
        name, session, held = await db.fetchrow(
            "SELECT s.name, s.session_id, count(*) FROM observers o JOIN services s ON s.id = o.service_id "
            "WHERE o.status = 'Processing' AND s.status = 'alive' AND s.name <> 'svc-0' "
            "GROUP BY s.name, s.session_id ORDER BY count(*) DESC LIMIT 1"
        )
        node = nodes[int(name.rsplit("-", 1)[1])]
        on_session = await db.fetchval("SELECT count(*) FROM observers WHERE host_session_id = $1", session)
        assert on_session == held, f"{name}'s session {session} holds {on_session} of its {held} observers"
        print(f"  killing {node.node}, where {name} holds {held:,}", flush=True)
        sampling = asyncio.create_task(timeline.run())
        handovers_before = await handovers(system)
        await asyncio.sleep(0.2)
        killed_at, began = time.time(), time.monotonic()
        node.kill()

        async def fenced() -> bool:
            # All of them, by its own count. The fleet's sum dipped and was back within 0.1 to
            # 0.2 s in two runs, before the fence was done (observers still moving at the kill,
            # most likely), and they timed the node kill at that (cluster-20261206T080230Z, …081504Z).
            found = await service_metrics({name: ports[name]})
            return any(metric == RUNNING and value == 0 for metric, value in found)

        async def all_running() -> bool:
            return (await running_by_their_count(ports))[0] >= size

        await until(fenced)  # its sockets closed at once; the starts return after the 2 s timer
        with profile.profiled(profiled[0], "node-kill", profiled[1]) if profiled else contextlib.nullcontext():
            await until(all_running)  # the hand-on needs seconds: the fence is seen first
        running_s = (await running_by_their_count(ports))[1] - killed_at
        await handed_on(db, session, size)
        seconds = time.monotonic() - began
        moved_by_balancer = await handovers(system) - handovers_before
    finally:
        if sampling is not None:
            sampling.cancel()
        await db.close()
    await asyncio.to_thread(node.start)
    hand_on = (began + node_death_raw.TIMEOUT_MS / 1000, began + running_s)
    cores = timeline.cores(*hand_on) | {"each service": timeline.busiest(*hand_on, "services")}
    return running_s, seconds, int(held), cores, moved_by_balancer


async def node_cut(system: System, services: list[Proc], nodes: list[infra.RabbitNode], size: int) -> tuple[float, int]:
    """Seconds from cutting off (``tools/infra/partition.py``) the node of the busiest service
    not on the manager's node until no observer is held by that service's old broker session and
    all are Processing; the node is then healed and waited for until it has rejoined."""
    db = await asyncpg.connect(system.database_url.replace("+asyncpg", ""))
    try:
        rows = await db.fetch(
            "SELECT s.name, s.session_id, count(*) AS n FROM observers o JOIN services s ON s.id = o.service_id "
            "WHERE o.status = 'Processing' AND s.status = 'alive' GROUP BY s.name, s.session_id ORDER BY n DESC"
        )
        name, session, held, node = next(
            (r["name"], r["session_id"], r["n"], node)
            for r in rows
            if (node := _session_node(next(p for p in services if p.name == r["name"]), nodes)) is not nodes[0]
        )
        print(f"  cutting {node.node} off, where {name} holds {held:,}", flush=True)
        began = time.monotonic()
        partition.cut(nodes, node)
        try:
            await handed_on(db, session, size)
            seconds = time.monotonic() - began
        finally:
            partition.heal(nodes)
    finally:
        await db.close()

    async def rejoined() -> bool:
        said = await asyncio.to_thread(node.ctl, "cluster_status", "--formatter", "json")
        return len(json.loads(said[said.index("{") :]).get("running_nodes", [])) == len(nodes)

    await until(rejoined)
    return seconds, int(held)


def _session_node(service: Proc, nodes: list[infra.RabbitNode]) -> infra.RabbitNode:
    """The node the service is connected to, as the broker lists its connections (each line
    starts with the port of the node it is on). A service that has just opened a session may
    not have its publish connection listed yet: asked again for a while (a run failed on it)."""
    deadline = time.monotonic() + 30
    while True:
        listing = nodes[0].ctl("-q", "list_connections", "--no-table-headers", "port", "client_properties")
        mine = [line for line in listing.splitlines() if f"observer-service {service.name} (publish)" in line]
        ports = {int(line.split("\t", 1)[0]) for line in mine}
        found = [n for n in nodes if n.port in ports]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise RuntimeError(f"{service.name} has no publish connection on any node of the cluster")
        time.sleep(0.5)


def _node_order(system: System, i: int) -> dict[str, str]:
    """Service i's node list, starting at node i (as ``make run`` gives it on a cluster)."""
    urls = system.env.get("ORCH_AMQP_URLS", "").split(",")
    if len(urls) < 2:
        return {}
    return {"ORCH_AMQP_URLS": ",".join(urls[i:] + urls[:i])}


def _start(system: System, name: str, size: int, ports: dict[str, int]) -> Proc:
    """Service ``name`` (``svc-<i>``) at node i, serving ``/metrics`` at a port noted in ``ports``."""
    ports[name] = free_port()
    order = _node_order(system, int(name.rsplit("-", 1)[1]))
    return system.start_service(name, size, True, ORCH_METRICS_PORT=str(ports[name]), **order)


def run_deployment(
    system: System,
    nodes: list[infra.RabbitNode],
    size: int,
    vhost: str,
    start_queues: int = 1,
    profile_dir: Path | None = None,
) -> Deployment:
    name = ("3-node cluster" if nodes else "one node") + (f", {start_queues} start queues" if start_queues > 1 else "")
    result = Deployment(name, start_queues)
    system.env["ORCH_START_QUEUES"] = str(start_queues)
    queues = topology.start_queue_names("default", start_queues)

    def leaders() -> dict[str, leader_work.Leader]:
        return leader_work.leaders(nodes[0], vhost, queues) if nodes else {}

    system.start_manager()
    ports: dict[str, int] = {}
    services = [_start(system, f"svc-{i}", size, ports) for i in range(3)]
    if nodes:  # the manager declares the queues past the first at its first balance round
        asyncio.run(until(lambda: _all_led(leaders, len(queues))))
    before, consumes = leaders(), asyncio.run(start_consumes(ports))
    result.create_per_s = asyncio.run(create(system, size))
    result.create_consumes = int(asyncio.run(start_consumes(ports)) - consumes)
    print(f"  {result.name}: create {result.create_per_s:,.0f}/s ({result.create_consumes:,} consumes)", flush=True)
    if nodes:
        result.leader_work["create"] = leader_work.work(before, leaders())
    result.service_kill_s, result.service_kill_moved = asyncio.run(service_kill(system, services, ports, size))
    print(f"  {result.name}: service kill {result.service_kill_s:.1f} s ({result.service_kill_moved:,})", flush=True)
    if nodes:
        print(
            f"  {result.name}: each service runs {asyncio.run(evened(system, size))} before the node kill", flush=True
        )
        before = leaders()
        profiled = (profile_dir, {s.name: s.popen.pid for s in services}) if profile_dir else None
        killed = asyncio.run(node_kill(system, nodes, ports, size, profiled))
        result.leader_work["node_kill"] = leader_work.work(before, leaders())
        result.node_kill_running_s, result.node_kill_s, result.node_kill_moved = killed[:3]
        result.node_kill_cores, result.node_kill_handovers = killed[3:]
        print(
            f"  {result.name}: node kill {result.node_kill_running_s:.1f} s until running, "
            f"{result.node_kill_s:.1f} s until the manager agrees ({result.node_kill_moved:,}; "
            f"{result.node_kill_handovers:,} hand-overs asked meanwhile)",
            flush=True,
        )
        print(f"  {result.name}: each service runs {asyncio.run(evened(system, size))} before the cut", flush=True)
        result.node_cut_s, result.node_cut_moved = asyncio.run(node_cut(system, services, nodes, size))
        print(f"  {result.name}: node cut off {result.node_cut_s:.1f} s ({result.node_cut_moved:,})", flush=True)
    return result


async def _all_led(leaders: Callable[[], dict[str, leader_work.Leader]], count: int) -> bool:
    return len(await asyncio.to_thread(leaders)) == count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=30_000)
    parser.add_argument("--failovers", type=int, default=1_000)
    parser.add_argument("--held", type=int, default=1_000, help="starts held through the failovers")
    parser.add_argument(
        "--only",
        choices=("deployments", "cluster", "failovers"),
        help="one half of the run (cluster: the cluster's deployments alone, not one node's)",
    )
    parser.add_argument(
        "--start-queues", type=int, default=3, help="the cluster again with this many start queues per pool (1: not)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the services over the node kill's hand-on (bench/profile.py); its figures are not to be quoted",
    )
    args = parser.parse_args(argv)
    infra.up()
    single, postgres, nodes = infra.rabbit_node(), infra.postgres_node(), infra.broker_cluster(3)
    started = datetime.now(UTC)
    out = results_path("cluster", started)
    results: dict[str, object] = {
        "started": started.isoformat(),
        "size": args.size,
        "targets": {"node_kill_running_s": NODE_DEATH_TARGET_S, "node_cut_s": PARTITION_TARGET_S},
    }
    deployments = []
    profile_dir = RESULTS / f"profile-cluster-{stamp(started)}" if args.profile else None
    layouts = [(False, 1), (True, 1)] + ([(True, args.start_queues)] if args.start_queues > 1 else [])
    if args.only == "cluster":
        layouts = layouts[1:]
    for on_cluster, start_queues in () if args.only == "failovers" else layouts:
        tag = f"bench_cluster_{int(time.time())}"
        broker = nodes[0] if on_cluster else single
        system = fresh_system(broker, postgres, tag, "orch-cluster-")
        system.env |= SCALE_ENV
        if on_cluster:
            # Service i at node i (``_node_order``), and it stays where a node's death moves it:
            # a return home during a later figure would hand its observers over meanwhile.
            system.env |= {
                "ORCH_QUEUE_TYPE": "quorum",
                "ORCH_AMQP_URLS": ",".join(n.url_for(tag) for n in nodes),
                "ORCH_BROKER_METRICS_URLS": ",".join(n.metrics_url for n in nodes),
                "ORCH_AMQP_HOME": "first",
                "ORCH_AMQP_RETURN_HOME_AFTER_S": "0",
            }
        try:
            deployments.append(
                run_deployment(system, nodes if on_cluster else [], args.size, tag, start_queues, profile_dir)
            )
        finally:
            system.stop_all()
            for node in nodes:
                if not node.is_running():
                    node.start()
            broker.delete_vhost(tag, timeout=600)
            postgres.drop_database(tag)
        results["deployments"] = [asdict(d) for d in deployments]
        write_results(out, results)
    clustered = [d for d in deployments if d.node_kill_moved]
    if clustered:
        raw = asyncio.run(node_death_raw.measure(nodes, max(1, args.size // 3)))
        for d in clustered:
            assert d.node_kill_moved is not None
            d.node_kill_raw_s = raw["first_s"] + d.node_kill_moved / raw["hand_on_per_s"]
        results["node_kill_raw"] = raw
        results["deployments"] = [asdict(d) for d in deployments]
        write_results(out, results)
    if deployments:
        print_deployments(deployments, results.get("node_kill_raw"))
    if args.only not in ("deployments", "cluster"):
        tag = f"bench_failovers_{int(time.time())}"
        nodes[0].add_vhost(tag)
        try:
            done = asyncio.run(failovers(nodes, tag, args.held, args.failovers))
        finally:
            nodes[0].delete_vhost(tag, timeout=600)
        results["failovers"] = asdict(done)
        write_results(out, results)
        print_failovers(done)
    print(f"results written to {out}")
    return 0


def print_deployments(deployments: list[Deployment], raw: Any = None) -> None:
    def head(d: Deployment) -> str:
        if not d.name.startswith("3-node"):
            return "one node"
        return f"cluster, {d.start_queues} queue{'s' if d.start_queues > 1 else ''}"

    print(f"\n{'figure':<34}" + "".join(f"{head(d):>20}" for d in deployments) + f"{'target':>10}")

    def row(label: str, values: list[float | None], target: str = "-", form: str = ".1f") -> None:
        cells = "".join(f"{'-':>20}" if v is None else f"{v:>20{form}}" for v in values)
        print(f"{label:<34}{cells}{target:>10}")

    row("create (observers/s)", [d.create_per_s for d in deployments], form=",.0f")
    row("consumers opened during the create", [d.create_consumes for d in deployments], form=",.0f")
    row("failover after a service kill (s)", [d.service_kill_s for d in deployments])
    node_death = f"<= {NODE_DEATH_TARGET_S:.0f}"
    row("node kill -> running (s)", [d.node_kill_running_s for d in deployments], node_death)
    row("  the raw broker, as many (s)", [d.node_kill_raw_s for d in deployments])
    row("node kill -> manager agrees (s)", [d.node_kill_s for d in deployments])
    partitioned = f"<= {PARTITION_TARGET_S:.0f}"
    row("failover after a node cut off (s)", [d.node_cut_s for d in deployments], partitioned)
    if raw:
        print(f"  the raw broker, cores over its hand-on: {cores_line(raw['hand_on_cores'])}")
    for d in deployments:
        if d.node_kill_cores:
            print(f"  {d.name}, cores over the node kill's hand-on: {cores_line(d.node_kill_cores)}")
    for d in deployments:
        for phase, queues in d.leader_work.items():
            for queue, done in sorted(queues.items()):
                since = " (since its election)" if done["elected"] else ""
                work = f"{done['reductions']:,} reductions{since}; {leader_work.batch_line(done)}"
                print(f"  {d.name}, {phase}: {queue} led by {done['node']}: {work}")


if __name__ == "__main__":
    sys.exit(main())
