"""The service's run loop: sessions, commands and graceful shutdown (what it reports: ``reports.py``).

    ServiceBorn ─► [session: consume, run observers, heartbeats, inventories] ─► lost?
         ▲                                                                       │
         └──────── fence (cancel its observers at once), back off, reconnect ◄───┘

SIGTERM/SIGINT: stop consuming, end every observer within the grace, hand every start back
at once (the work channel is closed: the broker requeues them in one batch) so other services
take them, report ServiceStopped, close, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import signal
import uuid
from collections.abc import Mapping
from typing import Any

from observer_service import health, home_node, metrics, net_ticktime
from observer_service.capacity import sized
from observer_service.inbox import Delivery, Inbox
from observer_service.lease import Lease
from observer_service.net_ticktime import NetTicktime, endpoint_urls
from observer_service.outbox import Outbox
from observer_service.refusals import Refusals
from observer_service.reports import Reports
from observer_service.retire import retire
from observer_service.runner import Runner
from observer_service.session import Session
from observer_service.settings import ServiceSettings
from observer_service.settle_queue import DeliveryChannel
from observer_service.start_consumers import Placement
from observer_service.watchdog import GcPauses, LoopWatchdog
from shared.backoff import backoff_delay
from shared.broker_nodes import BrokerNodes, node_name, warn_if_classic_on_cluster
from shared.errors import BrokerRefused, BrokerUnavailable, DecodeError
from shared.kinds import discover_kinds
from shared.logs import set_service_id
from shared.messages import (
    UNDER,
    ControlMessage,
    DescribeRequest,
    IntroduceRequest,
    InventoryRequest,
    IsolateObservers,
    ObserversHandedOver,
    RetireStarts,
    ServiceStopped,
    SetPlacement,
    SetStartQueues,
    StartObserver,
    StartsGone,
    StopObservers,
    decode_start,
)
from shared.outage import OutageLog
from shared.tls import client_context

logger = logging.getLogger(__name__)

# Retrying costs the broker one refused connection or one short handshake, while every
# second of backoff past the broker's return is a second the whole fleet runs nothing: hence
# a low cap, and jitter so that a fleet cut at one instant does not retry in lockstep.
_RECONNECT_MIN_S = 0.5
_RECONNECT_MAX_S = 2.0


def reconnect_delay(failures: int) -> float:
    """Seconds to wait after ``failures`` failed attempts in a row to open a session."""
    return backoff_delay(failures, _RECONNECT_MIN_S, _RECONNECT_MAX_S)


class ObserverService:
    def __init__(self, settings: ServiceSettings) -> None:
        settings, capacity = sized(settings)
        if capacity is not None:
            logger.info(
                "capacity from the machine (%d CPU(s), %.0f MiB available): %d workers, %d process slot(s)",
                capacity.cpus,
                capacity.memory_mb,
                settings.workers_count,
                settings.process_slots,
            )
        self.settings = settings
        home_key = settings.service_name if settings.amqp_home == "by-name" else None
        self.nodes = BrokerNodes(settings.broker_urls(), home_key=home_key)
        self.placement = Placement()  # how it takes new starts, as the manager last said
        # Failed attempts to open a session, said when they begin, each minute, and when one works.
        self.outage = OutageLog(logger, "cannot open a broker session", "broker session open again")
        self.service_id = uuid.uuid4()
        set_service_id(str(self.service_id))
        self.outbox = Outbox(settings.outbox_max, settings.outbox_high_water)
        self.lease = Lease(settings.amqp_heartbeat_s, cluster=settings.queue_type == "quorum")
        # On a cluster the give-up bound is checked against the broker's net_ticktime.
        urls = endpoint_urls(self.nodes.urls, settings.broker_metrics_urls) if settings.queue_type == "quorum" else []
        self.ticktime = NetTicktime(
            urls,
            settings.lease_give_up_s,
            self.lease.validity_s / 4,
            client_context(settings.amqp_ca_file, settings.amqp_cert_file, settings.amqp_key_file) if urls else None,
        )
        self.runner = Runner(settings, self.service_id, self.outbox, discover_kinds())
        self.inbox = Inbox(self.outbox, self.runner.gc, self.runner.admit, self.runner.spawn)
        self.refusals = Refusals()
        self.session: Session | None = None
        self.shutdown = asyncio.Event()
        # ServiceStopped is queued: nothing may follow it (the manager marks the row deleted,
        # and a heartbeat after that reads as a namesake's clash: an IntroduceRequest).
        self.said_goodbye = False
        # The session handed everything over to move to the home node: the next opens there.
        self._moved_home = False
        self.gc_pauses = GcPauses()
        self.watchdog = LoopWatchdog(gc_pauses=self.gc_pauses)
        self.reports = Reports(
            self.service_id, self.outbox, self.runner, self.refusals, self.watchdog, self._reporting_session
        )

    def _reporting_session(self) -> Session | None:
        return None if self.said_goodbye else self.session

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.shutdown.set)
        if self.settings.metrics_port:
            self._serve_metrics()
        self.reports.born(self.settings)
        logger.info("service %s (%s) starting", self.settings.service_name, self.service_id)
        warn_if_classic_on_cluster(self.nodes.urls, self.settings.queue_type)
        # What API callers may make this service do (docs/threat-model.md), said once at start.
        logger.info(
            "periodic may call functions of: %s; http_poll/websocket may connect to: %s, never to: %s",
            ", ".join(self.settings.periodic_modules) or "nothing (ORCH_PERIODIC_MODULES unset)",
            ", ".join(map(str, self.settings.egress_allow)) or "anywhere",
            ", ".join(map(str, self.settings.egress_deny)) or "-",
        )
        self.watchdog.start()
        self.gc_pauses.install()
        metrics.RUNNING.set_function(lambda: len(self.runner.running))
        metrics.CHILDREN.set_function(self.runner.running.children)
        metrics.LAST_START.set_function(lambda: self.runner.last_started_at)
        loops = [
            asyncio.create_task(c)
            for c in (
                self.reports.heartbeat_loop(self.settings.heartbeat_s),
                self.reports.digest_loop(self.settings.inventory_s),
                self.runner.gc.maintain(lambda: len(self.runner.running)),
            )
        ]
        try:
            if self.ticktime.urls:
                # Read before the first session opens, so that it already uses a bound that fits.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.ticktime.check(), 2 * net_ticktime.READ_TIMEOUT_S)
                loops.append(asyncio.create_task(self.ticktime.watch()))
            await self._session_loop()
            await self._graceful_stop()
        finally:
            self.watchdog.stop()
            for task in loops:
                task.cancel()

    def _serve_metrics(self) -> None:
        """First of all, before the service tells anyone it exists: a port it cannot bind
        (taken, or a host it has no address on) is a setting to fix, said in one line,
        and the service exits with status 2 rather than a traceback."""
        host, port = self.settings.metrics_host, self.settings.metrics_port
        probes = health.Probes(lambda: self.watchdog.last_tick, self._readiness, self.settings.health_stall_s)
        try:
            health.serve(host, port, probes)
        except OSError as e:
            logger.critical(
                "cannot serve metrics on %s:%d (%s): set ORCH_METRICS_PORT to a free port, or 0 for no metrics",
                host,
                port,
                e.strerror or e,
            )
            raise SystemExit(2) from None
        logger.info("metrics on http://%s:%d/metrics, probes on /healthz and /readyz", host, port)

    def _readiness(self) -> tuple[bool, dict[str, Any]]:
        """What ``/readyz`` says (read on the health thread): consuming, or why not."""
        session = self.session
        if self.shutdown.is_set():
            return False, {"status": "stopping"}
        if session is None or session.closed.is_set():
            why = self.refusals.session or "no broker session: connecting"
            return False, {"status": "not consuming", "detail": why}
        refused = self.refusals.summary()
        if refused:
            return True, {"status": "degraded", "detail": refused}
        return True, {"status": "consuming", "pools": list(self.settings.pools)}

    async def _session_loop(self) -> None:
        failures = 0
        markers_left: list[tuple[str, str]] = []  # queue markers a lost connection left
        while not self.shutdown.is_set():
            session = Session(
                self.settings, self.service_id, self.lease, self.nodes.current, markers_left, self.ticktime.give_up_s
            )
            try:
                await session.open(
                    functools.partial(self._on_start, session=session),
                    self._on_control,
                    self.refusals.pool,
                    self.outbox,
                    self.placement,
                )
            except BrokerUnavailable as e:
                markers_left = session.markers_left
                failures += 1
                delay = reconnect_delay(failures)
                self.nodes.failed()  # the next attempt tries the next node of a cluster
                # A refusal is retried as often (a vhost refused a moment is one being made
                # again after the broker lost its data) but said once a minute, as an ERROR.
                if isinstance(e, BrokerRefused):
                    self.refusals.session_refused(e.hint)
                else:
                    self.outage.failed(str(e))
                await _wait_any(self.shutdown, timeout=delay)
                continue
            failures = 0
            self.outage.worked()
            self.refusals.session_opened()
            self.session = session
            if session.placement != self.placement:
                # Told while the session opened: its consumers still use the one it opened with.
                self.runner.spawn(self._consume_under(session, self.placement))
            self.reports.inventory()
            homing = self._watch_home(session)
            await _wait_any(self.shutdown, session.closed)
            if homing is not None:
                await _ended(homing)
            if self.shutdown.is_set() and not session.closed.is_set():
                return  # graceful stop uses this live session
            self.session = None
            held = self._held(session)
            await self.runner.fence(session)
            gone = self._starts_gone(session, held, await session.deleted_pools())
            await session.close(session.close_reason)
            markers_left = session.markers_left
            if gone is not None:
                self.outbox.put(gone)  # after the fence: no copy of them runs any more
            stale = self.outbox.discard_started(session)
            if stale:
                logger.warning("dropped %d unpublished start report(s) and inventories of the dead session", stale)
            self.runner.gc.fenced()
            self._emptied()
            # On a cluster the next session starts at the next node: the one this session
            # lost may be down, or up but cut off from the others (which answers a connect).
            if self._moved_home:
                self._moved_home = False
                self.nodes.go_home()
            else:
                self.nodes.failed()

    def _watch_home(self, session: Session) -> asyncio.Task[None] | None:
        """On a cluster, a session away from the home node moves there once it is back."""
        after_s = self.settings.amqp_return_home_after_s
        if self.nodes.at_home or not after_s or self.settings.queue_type != "quorum":
            return None
        return asyncio.create_task(self._return_home(session, after_s))

    async def _return_home(self, session: Session, after_s: float) -> None:
        """Hand every observer over, as a graceful stop does, and end the session so that
        the next one opens at home (``home_node.py``: why, and what it costs). The hand-over
        is reported before the starts go back: one the broker gives straight back to a service
        is started and reported after it."""
        name = f"observer-service {self.settings.service_name} (home probe)"
        await home_node.until_back(self.nodes.home_url, name, after_s)
        if session.closed.is_set() or self.shutdown.is_set():
            return
        home = node_name(self.nodes.home_url)
        logger.info("moving back to home broker node %s: handing %d observer(s) over", home, len(self.runner.running))
        await session.stop_consuming()
        self.inbox.accepting = False  # what waits stays unsettled: requeued with the rest
        try:
            ended = await self.runner.end_all()
            if ended:
                reason = "its service moved back to its home broker node"
                report = ObserversHandedOver(
                    service_id=self.service_id, session_id=session.id, observer_ids=ended, reason=reason
                )
                self.outbox.put(report, session)
                await self.outbox.wait_empty(timeout=5)
            await session.requeue_held()
        finally:
            self.inbox.accepting = True
        self._moved_home = True  # whatever ends the session now: it gave every start back
        session.fail("moving back to the home broker node", expected=True)

    def _held(self, session: Session) -> list[StartObserver]:
        """The starts ``session`` holds: those of the observers it runs, and of those still
        waiting to be admitted."""
        held = [r.start() for r in self.runner.running.values() if r.session is session]
        return held + [start for d in self.inbox.waiting if d.session is session and (start := _decoded(d.body))]

    def _starts_gone(self, session: Session, held: list[StartObserver], pools: set[str]) -> StartsGone | None:
        """The starts this ended session held from a start queue that was deleted."""
        if not pools:
            return None
        ids = [start.observer_id for start in held if start.pool in pools]
        if not ids:
            return None
        logger.warning(
            "%d start(s) went with the deleted start queue(s) of %s: the manager publishes them again",
            len(ids),
            ", ".join(sorted(pools)),
        )
        return StartsGone(service_id=self.service_id, session_id=session.id, pools=sorted(pools), observer_ids=ids)

    async def _graceful_stop(self) -> None:
        session = self.session
        logger.info("shutting down: handing %d observer(s) over", len(self.runner.running))
        if session is None:
            return
        await session.stop_consuming()
        self.inbox.accepting = False  # what waits stays unsettled: requeued with the rest
        released = await self.runner.end_all()
        await session.requeue_held()  # only now: every observer has ended
        self.said_goodbye = True
        self.outbox.put(ServiceStopped(service_id=self.service_id, released=released))
        if not await self.outbox.wait_empty(timeout=5):
            logger.warning("could not publish %d report(s) before exit", len(self.outbox))
        await session.close("service stopped")
        logger.info("service %s stopped", self.service_id)

    # --- message handlers ----------------------------------------------------------------

    def _on_start(
        self,
        body: bytes,
        channel: DeliveryChannel,
        tag: int,
        redelivered: bool,
        aside: bool,
        headers: Mapping[str, Any] | None,
        received_at: float,
        *,
        session: Session,
    ) -> None:
        if session.closed.is_set() or self.shutdown.is_set():
            return  # not ours to run any more; the broker requeues it
        self.inbox.put(Delivery(body, channel, tag, redelivered, session, aside, headers, received_at))

    def _on_control(self, command: ControlMessage) -> None:
        """A control command, decoded and acked on the holding thread (``holding.py``). One
        aimed at another service (it came by the fanout) is not ours."""
        if command.service_id not in (None, self.service_id):
            return
        match command:
            case StopObservers():
                self.runner.on_stop(command)
            case SetPlacement():
                pools = tuple(sorted(command.pools.items()))
                self._place(Placement(command.priority, command.cordoned, pools, command.start_queues))
            case SetStartQueues():
                queues = max(self.placement.start_queues, command.start_queues)
                self._place(dataclasses.replace(self.placement, start_queues=queues))
            case RetireStarts():
                session = self.session
                if session is not None:
                    self.runner.spawn(self._retire(session, command))
            case InventoryRequest():
                self.reports.inventory()
            case IsolateObservers():
                self.runner.probation.isolate(command.observer_ids, command.reason)
            case DescribeRequest():
                self.reports.describe(command.observer_ids)
            case IntroduceRequest():
                self._introduce(name_taken=command.name_taken)

    def _emptied(self) -> None:
        """Its session ended and it runs nothing: the next one takes starts first. Those it
        held come back once the queue lets the ended session go (2 s after a node's death)
        and should come back here; the balancer's placement saying so can come later (its
        command refused on the dead node's control queue, the others confirming theirs while
        busy taking starts: docs/design.md, "Even load"). The balancer's next word wins."""
        emptied = self.placement.emptied()
        if emptied != self.placement:
            logger.info("runs nothing since its session ended: its next one takes starts first (priority %d)", UNDER)
        self.placement = emptied

    def _place(self, placement: Placement) -> None:
        """Take new starts under ``placement``: this session at once, every later one from its
        open (``start_consumers.py``)."""
        if placement.cordoned != self.placement.cordoned:
            logger.info("cordoned: no new starts here" if placement.cordoned else "uncordoned: taking starts again")
        self.placement = placement
        session = self.session
        if session is not None:
            self.runner.spawn(self._consume_under(session, placement))

    async def _consume_under(self, session: Session, placement: Placement) -> None:
        """Consume under ``placement``, then say so at once: the balancer moves nothing in a
        pool until its services' heartbeats confirm their placements (``manager/balance``)."""
        await session.place(placement)
        self.reports.heartbeat()

    async def _retire(self, session: Session, ask: RetireStarts) -> None:
        """Move starts off start queues past ``ORCH_START_QUEUES`` (``retire.py``), then say
        at once what is left: the balancer asks again from the next heartbeat."""
        if await retire(self.runner, self.outbox, self.service_id, session, ask):
            self.reports.heartbeat()

    def _introduce(self, *, name_taken: bool) -> None:
        """Our ServiceBorn never reached the manager's database (or the database was restored
        from before it): introduce ourselves again, then say what we run."""
        if name_taken:
            name = f"{self.settings.service_name}-{self.service_id.hex[:8]}"
            logger.error(
                "another live service has the name %r: this one is %r from now on (set ORCH_SERVICE_NAME "
                "to a name of its own per service)",
                self.settings.service_name,
                name,
            )
            self.settings = self.settings.model_copy(update={"service_name": name})
        else:
            logger.warning("the manager does not know this service: sending ServiceBorn again")
        self.reports.born(self.settings)
        self.reports.inventory()


async def _ended(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait for it to end; an error it ended with is logged."""
    task.cancel()
    await asyncio.wait([task])  # ``await task`` would raise its CancelledError, not told from ours
    if not task.cancelled() and (error := task.exception()) is not None:
        logger.error("moving back to the home broker node failed: %r", error, exc_info=error)


def _decoded(body: bytes) -> StartObserver | None:
    try:
        return decode_start(body)
    except DecodeError:
        return None


async def _wait_any(*events: asyncio.Event, timeout: float | None = None) -> None:
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
            with contextlib.suppress(BaseException):
                await waiter
