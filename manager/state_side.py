"""The manager's state side: the state consumer and the repairs (``manager/repairs``).

By default (``ORCH_STATE_PROCESS=true``) ``python -m manager`` runs the API in one process and
this side in a child process of it, so the two use two cores and applying a flood of
reports never stalls an API request; ``false`` runs both in one process. Either way exactly
one state side runs per manager, and of several managers only the leader's applies state and
runs the repairs (``manager/state/leadership.py``).

The child:
* dies with its parent (``PR_SET_PDEATHSIG``): a ``kill -9`` of the manager leaves no state
  consumer behind;
* is started again by the parent, after a pause, if it exits on its own;
* serves its counters (``STATE_REGISTRY``) on a loopback socket its parent bound and keeps
  (``StateSupervisor``); the API's ``/metrics`` adds them to its own.

It publishes only follow-ups and the starts its repairs publish again; the API process
publishes creates (``manager/repairs/pending_starts.py`` says how the two stay apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db.engine import SchemaOutdated, make_engine, make_sessionmaker
from manager.db.startup import DatabaseRefused, wait_for_schema
from manager.metrics import STATE_REGISTRY
from manager.queue_waker import StartQueueWaker
from manager.repairs.loop import RepairLoop, state_side_repairs
from manager.settings import ManagerSettings, get_manager_settings
from manager.start_publisher import StartPublisher
from manager.state.consumer import StateConsumer
from manager.state.leadership import LeaderLock
from manager.state.probation import ProbationPolicy
from manager.state.rules import StateRules
from manager.state.scheduler import Scheduler
from manager.state.supervisor import METRICS_FD_ENV, PARENT_PID_ENV
from shared import amqp_frames, topology, tracing
from shared.event_loop import loop_factory
from shared.linux import die_with_parent
from shared.logs import configure_logging
from shared.settings import settings_or_exit

logger = logging.getLogger("manager.state_side")  # not "__main__" when run with -m


class StateSide:
    """The state consumer and the repairs, on the caller's sessions and broker link (started),
    run while this manager is the leader (``manager/state/leadership.py``)."""

    def __init__(
        self,
        settings: ManagerSettings,
        engine: AsyncEngine,
        sessions: async_sessionmaker[AsyncSession],
        broker: BrokerLink,
        starts: StartPublisher | None = None,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.broker = broker
        # Single-process mode shares the API's: its in-flight starts are this side's too.
        self.starts = starts or StartPublisher(sessions, broker)
        self.lock = LeaderLock(engine, settings.name, settings.leader_timeout_s)

    async def run(self) -> None:
        """Lead whenever this manager holds the leader lock, until cancelled."""
        while True:
            await self.lock.acquire()
            try:
                reason = await self._lead()
            finally:
                await self.broker.stop_consuming_state()
                await self.lock.release()
            logger.warning("%s gave up the lead (%s); it stands by", self.settings.name, reason)

    async def _lead(self) -> str:
        """Apply state and run the repairs until the lock is lost; return why it was. Each
        term starts afresh: what a repair or the consumer remembers of an earlier term may be
        stale after another manager led."""
        settings = self.settings
        rules = StateRules(
            ProbationPolicy(
                settings.probation_after_host_deaths,
                settings.probation_window_s,
                settings.probation_min_share,
                settings.probation_budget,
            ),
            settings.start_queues,
        )
        consumer = StateConsumer(self.sessions, self.broker, rules, on_database_error=self.lock.doubt)
        repairs = RepairLoop(
            state_side_repairs(settings, self.sessions, self.broker, rules, self.starts, consumer.idle),
            self.broker,
            settings.repair_interval_s,
            on_database_error=self.lock.doubt,
        )
        waker = StartQueueWaker(settings, self.sessions, self.broker)
        scheduler = Scheduler(self.sessions, self.broker, self.starts)
        work: asyncio.Future[Any] = asyncio.ensure_future(
            asyncio.gather(consumer.run(), repairs.run(), waker.run(), scheduler.run(), self._consume(consumer))
        )
        lost: asyncio.Future[Any] = asyncio.ensure_future(self.lock.lost())
        try:
            await asyncio.wait([work, lost], return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            work.cancel()
            # A failure of the state side is raised here: the state process exits and is started again.
            with contextlib.suppress(asyncio.CancelledError):
                await lost
            with contextlib.suppress(asyncio.CancelledError):
                await work
        return str(lost.result())

    async def _consume(self, consumer: StateConsumer) -> None:
        """Consume the state queue, trying again while the broker refuses."""
        failures = 0
        while True:
            try:
                await self.broker.consume_state(consumer.on_message)
                return
            except Exception as e:  # noqa: BLE001 - the broker's trouble: the connection retries
                failures += 1
                log = logger.warning if failures == 1 else logger.debug
                log("cannot consume %s yet (%s); retrying", topology.STATE_QUEUE, f"{type(e).__name__}: {e}")
                await asyncio.sleep(1.0)


# --- the child process ---------------------------------------------------------------------


def main() -> None:
    """``python -m manager.state_side``: the state side alone (started by the manager)."""
    parent = os.environ.get(PARENT_PID_ENV)
    if parent is not None:
        die_with_parent(int(parent))
    settings = settings_or_exit(get_manager_settings)
    configure_logging(settings.log_level, "manager:state", settings.log_format)
    fd = os.environ.get(METRICS_FD_ENV)
    if fd is not None:
        _serve_metrics(socket.socket(fileno=int(fd)))
    if tracing.setup("orchestrator-manager"):
        tracing.instrument_asyncpg()
    amqp_frames.install()
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        try:
            runner.run(_run_until_signalled(settings))
        except (DatabaseRefused, SchemaOutdated) as e:
            logger.critical("%s", e)  # one line: waiting cannot fix it (manager/db/startup.py)
            raise SystemExit(2) from None
        finally:
            tracing.shutdown()  # SIGTERM ends the run: export the spans still held


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Not a line per scrape."""


def _serve_metrics(listener: socket.socket) -> None:
    """Serve ``STATE_REGISTRY`` on the parent's listening socket (``StateSupervisor``), from a
    daemon thread, as ``prometheus_client.start_http_server`` does on a port it binds."""
    server = ThreadingWSGIServer(listener.getsockname(), _QuietHandler, bind_and_activate=False)
    server.socket.close()
    server.socket = listener
    server.server_name, server.server_port = listener.getsockname()[:2]
    server.setup_environ()
    server.set_app(make_wsgi_app(STATE_REGISTRY))
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()


async def _let_closing_finish(timeout_s: float = 2.0) -> None:
    """Wait (bounded) for the tasks a closed connection set off, before the loop closes, on
    every way out (a stop, a refused start): aio-pika runs its close callbacks as tasks of
    their own, and a loop closed under one prints "Task was destroyed but it is pending" and a
    traceback after the process's one line saying why it stops (docs/design.md, "Broker facts
    the code depends on")."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (others := asyncio.all_tasks() - {asyncio.current_task()}) and loop.time() < deadline:
        await asyncio.wait(others, timeout=deadline - loop.time())


async def _run_until_signalled(settings: ManagerSettings) -> None:
    engine = make_engine(settings.database_url, tls=settings.database_tls_context())
    sessions = make_sessionmaker(engine)
    broker = BrokerLink(settings)
    side = StateSide(settings, engine, sessions, broker)
    # The broker's connection is made while the schema is checked, not after it: a restarted
    # manager's backlog waits for both (docs/design.md, "Two processes for the manager").
    # Nothing is consumed, applied or acked on a database the check refuses
    # (``tests/system/test_state_start.py``): the state side consumes once it leads.
    broker.start()
    asked = asyncio.Event()  # SIGTERM came: the side's end is a stop, not a failure
    try:
        await wait_for_schema(engine, "the state process", logger)
        task = asyncio.create_task(side.run())
        gc.collect()
        gc.freeze()  # start-up objects are never garbage: keep full collections from walking them
        # SIGTERM from the parent stops us; Ctrl-C in a terminal reaches the parent too, which
        # then sends SIGTERM: ignoring SIGINT here keeps the shutdown in that one order.
        loop = asyncio.get_running_loop()

        def stop() -> None:
            asked.set()
            task.cancel()

        loop.add_signal_handler(signal.SIGTERM, stop)
        loop.add_signal_handler(signal.SIGINT, lambda: None)
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await broker.close()
        await engine.dispose()
        await _let_closing_finish()
    if not asked.is_set():
        # Cancelled from within: a CancelledError that escaped a call (shared/amqp_errors.py)
        logger.error("the state side stopped without being asked to; the manager starts it again")
        raise SystemExit(1)
    logger.info("state process stopped")


if __name__ == "__main__":
    main()
