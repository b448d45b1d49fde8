"""Each observer service's own ``/metrics`` (Prometheus text format), served on
``ORCH_METRICS_PORT`` by prometheus_client's HTTP server thread (0: not served)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

RUNNING = Gauge("orch_service_observers_running", "Observers running on this service", registry=REGISTRY)
# Unix time, as Prometheus's *_timestamp_seconds: a service that stopped taking starts shows as
# ``time() - orch_service_last_start_timestamp_seconds``; the bench times a failover by it.
LAST_START = Gauge(
    "orch_service_last_start_timestamp_seconds",
    "When this service last started an observer (0: never)",
    registry=REGISTRY,
)
CHILDREN = Gauge("orch_service_observer_processes", "Observers running in child processes", registry=REGISTRY)
# In seconds, Prometheus's base unit: promtool refuses abbreviated units such as _ms
# (tests/system/test_alerts.py). The heartbeat and /api/services keep their milliseconds.
LOOP_LAG = Gauge(
    "orch_service_loop_lag_seconds", "Worst event-loop lag of the last heartbeat period", registry=REGISTRY
)
RESTARTS = Counter("orch_service_observer_restarts", "Observer bodies restarted in place", registry=REGISTRY)
FAILURES = Counter("orch_service_observer_failures", "Observers that failed for good here", registry=REGISTRY)
EMITS = Counter("orch_service_emits", "Events published by observers", registry=REGISTRY)
FENCED = Counter("orch_service_observers_fenced", "Observers cancelled because their session died", registry=REGISTRY)
SESSIONS_LOST = Counter(
    "orch_service_sessions_lost", "Broker sessions that ended without being closed on purpose", registry=REGISTRY
)
EMITS_DELAYED = Counter(
    "orch_service_emits_delayed",
    "Emits that waited for a slot (ORCH_EMITS_IN_FLIGHT were in flight)",
    registry=REGISTRY,
)
LEASE_ROUND_TRIP = Histogram(
    "orch_service_lease_round_trip_seconds",
    "Time from sending a lease round trip to its answer (the broker's latency on the holding connection)",
    registry=REGISTRY,
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
STARTS_PAST_WORKERS = Counter(
    "orch_service_starts_past_workers",
    "Starts delivered past the pool's workers (several start queues delivered at once), handed back unrun",
    registry=REGISTRY,
)
START_CONSUMES = Counter(
    "orch_service_start_consumes",
    "Consumers opened on start queues (a placement changed, a step aside, a window full before); "
    "a quorum queue keeps a cancelled one's record while its deliveries are held",
    registry=REGISTRY,
)
STARTS_DECLINED = Counter(
    "orch_service_starts_declined",
    "Starts this service could not run (a kind it lacks, no free process slot), handed on to another",
    ["reason"],
    registry=REGISTRY,
)
STARTS_AWAITING_LEASE = Counter(
    "orch_service_starts_awaiting_lease",
    "Times starting deliveries paused until the fencing lease was renewed (it had lapsed)",
    registry=REGISTRY,
)
STARTS_HELD_BACK = Counter(
    "orch_service_starts_held_back",
    "Times starting deliveries paused because ORCH_OUTBOX_HIGH_WATER reports awaited publishing",
    registry=REGISTRY,
)
REFUSED = Gauge(
    "orch_service_refused",
    "Things the broker refuses this service now, for good until fixed (a pool's start queue, the session)",
    registry=REGISTRY,
)
REFUSALS = Counter(
    "orch_service_refusals", "Refusals by the broker that retrying cannot heal (each attempt)", registry=REGISTRY
)
EMITS_WAITING = Gauge("orch_service_emits_waiting", "Emits waiting for a slot now", registry=REGISTRY)
LEASE_GIVE_UP = Gauge(
    "orch_service_lease_give_up_seconds",
    "On a cluster, how long an unrenewed lease ends a session: ORCH_LEASE_GIVE_UP_S, lowered to fit the "
    "broker's net_ticktime",
    registry=REGISTRY,
)
