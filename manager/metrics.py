"""``GET /metrics`` of the manager, in the Prometheus text format.

Counts that live in the database (observers, services, capacity) are read when scraped;
what happens inside the process (state messages applied, stop re-sends, API latency) is
counted as it happens. A registry of our own, so nothing else leaks into the output.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.counts import observer_counts
from manager.db.oldest_stop import oldest_stop_age_s
from manager.db.services import stats

REGISTRY = CollectorRegistry()

OBSERVERS = Gauge("orch_observers", "Observers by status, pool and kind", ["status", "pool", "kind"], registry=REGISTRY)
SERVICES = Gauge("orch_services", "Observer services by state", ["state"], registry=REGISTRY)
CAPACITY = Gauge("orch_pool_workers", "Workers of the live services of a pool", ["pool"], registry=REGISTRY)
CAPACITY_FREE = Gauge(
    "orch_pool_workers_free", "Workers not running an observer, per pool", ["pool"], registry=REGISTRY
)
PROBATION = Gauge(
    "orch_observers_on_probation",
    "Live observers on probation (run in a child process because their services died too often)",
    registry=REGISTRY,
)
STOPPING_OLDEST = Gauge(
    "orch_observers_stopping_oldest_seconds",
    "How long the oldest stop still OnDeleting has waited (0: none waits); services end a stop in seconds",
    registry=REGISTRY,
)
PAUSED = Gauge(
    "orch_observers_paused",
    "Observers on probation not yet running in a child process: paused (their delivery held) until their service has "
    "a free process slot",
    registry=REGISTRY,
)
AWAITING_BROKER = Gauge(
    "orch_observers_awaiting_broker",
    "Observers Created on no service whose start waits for the broker to hand it on: the broker session of the "
    "service that ran them ended (a node died or was cut off)",
    registry=REGISTRY,
)
STATE_BACKLOG = Gauge("orch_state_queue_backlog", "State messages waiting in the broker", registry=REGISTRY)
# Counted by the state side, which may run in a process of its own (manager.state_side):
# the API's /metrics adds this registry's text to its own.
STATE_REGISTRY = CollectorRegistry()
STATE_APPLIED = Counter(
    "orch_state_messages_applied", "State messages applied to the database", registry=STATE_REGISTRY
)
STATE_BUSY = Counter(
    "orch_state_busy_seconds",
    "Time the state consumer spent by phase: transaction, publish and ack are its one worker, whose "
    "summed rate near 1 s/s means reports arrive faster than they are applied; decode happens as "
    "messages arrive, overlapping the others",
    ["phase"],
    registry=STATE_REGISTRY,
)
STATE_BATCHES = Counter(
    "orch_state_batches", "Batches of state messages applied (one transaction each)", registry=STATE_REGISTRY
)
SERVICES_LOST = Counter(
    "orch_services_lost", "Services judged lost (their broker connection was gone)", registry=STATE_REGISTRY
)
SERVICES_LATE = Counter(
    "orch_services_late",
    "Times a service's heartbeats were late while its broker connection lived (not judged lost)",
    registry=STATE_REGISTRY,
)
DIGESTS_COMPARED = Counter("orch_inventory_digests", "Service digests compared with the rows", registry=STATE_REGISTRY)
DIGEST_MISMATCHES = Counter(
    "orch_inventory_digest_mismatches",
    "Service digests that disagreed with the rows (each answered with a request for the whole inventory)",
    registry=STATE_REGISTRY,
)
START_QUEUES_KEPT_AWAKE = Gauge(
    "orch_start_queues_kept_awake",
    "Start queues kept from hibernating (their pools' live observers reach ORCH_START_QUEUE_KEEP_AWAKE_FROM)",
    registry=STATE_REGISTRY,
)
STATE_LEADER = Gauge(
    "orch_state_leader",
    "1 while this manager applies state reports and runs the repairs (the leader), 0 while it stands by",
    registry=STATE_REGISTRY,
)
SCHEDULED_STARTS = Counter(
    "orch_scheduled_starts", "Scheduled observers started at their start_at", registry=STATE_REGISTRY
)
SCHEDULED_EXPIRED = Counter(
    "orch_scheduled_expired", "Observers stopped at their stop_at (or run_for_s)", registry=STATE_REGISTRY
)
STOP_RESENDS = Counter("orch_stop_resends", "Stops broadcast again because still OnDeleting", registry=STATE_REGISTRY)
PROBATION_DEFERRED = Counter(
    "orch_probation_deferred",
    "Suspects of a service's death not put on probation because the fleet's budget (ORCH_PROBATION_BUDGET) or "
    "their service's process slots were taken",
    registry=STATE_REGISTRY,
)
HANDOVERS = Counter(
    "orch_handovers",
    "Observers the balancer asked a service to hand over, by reason (`even load`, `drain`)",
    ["reason"],
    registry=STATE_REGISTRY,
)
STARTS_RETIRED = Counter(
    "orch_starts_retired",
    "Starts the balancer asked services to move off start queues past ORCH_START_QUEUES (each published again "
    "to its queue under it)",
    registry=STATE_REGISTRY,
)
HELD_PAST_START_QUEUES = Gauge(
    "orch_starts_held_past_start_queues",
    "Starts the services' heartbeats say they hold from start queues past ORCH_START_QUEUES, still to be moved",
    registry=STATE_REGISTRY,
)
FLEET_IMBALANCE = Gauge(
    "orch_fleet_imbalance",
    "The largest deviation of a service's observers from its fair share of its pool, as a fraction of that share",
    registry=STATE_REGISTRY,
)
API_REFUSED_BUSY = Counter(
    "orch_api_refused_busy", "Creates and stops refused with 503 (ORCH_API_IN_FLIGHT reached)", registry=REGISTRY
)
API_CREATE_GROUP = Histogram(
    "orch_api_create_group_size",
    "Single creates that shared one transaction and one publish (manager/create_groups.py)",
    registry=REGISTRY,
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000),
)
API_CREATES_WAITING = Gauge(
    "orch_api_creates_waiting", "Single creates waiting for the group before theirs to finish", registry=REGISTRY
)
API_LATENCY = Histogram(
    "orch_api_request_seconds",
    "API request latency",
    ["method", "route", "status"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


async def render(session: AsyncSession, state_backlog: int | None) -> bytes:
    OBSERVERS.clear()  # a combination that no longer exists must disappear
    for count in await observer_counts(session):
        OBSERVERS.labels(count.status.value, count.pool, count.kind).set(count.n)
    summary = await stats(session)
    for state, count in summary["services"].items():
        SERVICES.labels(state).set(count)
    PROBATION.set(summary["probation"])
    PAUSED.set(summary["paused"])
    AWAITING_BROKER.set(summary["awaiting_broker"])
    CAPACITY.clear()
    CAPACITY_FREE.clear()
    for pool, capacity in summary["capacity"].items():
        CAPACITY.labels(pool).set(capacity["total"])
        CAPACITY_FREE.labels(pool).set(capacity["free"])
    STOPPING_OLDEST.set(await oldest_stop_age_s(session))
    if state_backlog is not None:
        STATE_BACKLOG.set(state_backlog)
    return generate_latest(REGISTRY)
