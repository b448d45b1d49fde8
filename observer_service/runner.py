"""The observers this service runs, one asyncio task each, keyed by observer id.

Invariants:
* An observer runs only while its start message is held unacked on a live session; the
  delivery is acked only once its task has finished (stop), requeued with all the others
  once every task has finished on handoff, rejected (dead-lettered) on failure, and simply
  dropped when the session died (the broker requeues it by itself).
* Every report about an observer goes through the outbox, in the order things happened.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from pydantic import ValidationError

from observer_service import metrics
from observer_service.declines import Declines
from observer_service.gc_policy import GcPolicy
from observer_service.inbox import Delivery
from observer_service.observer import MAX_ERROR_CHARS, Context, ObserverGaveUp, Running, supervise
from observer_service.outbox import Outbox, StartedReport
from observer_service.probation import Probation
from observer_service.registry import Registry
from observer_service.session import Session
from observer_service.settings import ServiceSettings
from observer_service.settle import ack_once_confirmed, settle, until_confirmed
from observer_service.start_log import StartLog
from observer_service.stop_memory import StopMemory
from shared import tracing
from shared.errors import DecodeError, LeaseLost
from shared.kinds import LoadedKind
from shared.messages import (
    ObserverFailed,
    ObserversHandedOver,
    ObserverStopped,
    StopObservers,
    decode_start,
)

logger = logging.getLogger(__name__)

_FENCE_UNWIND_S = 1.0

# Settling thousands of deliveries in one go would starve the event loop (heartbeats, the
# lease round trip): yield after every this many.
_YIELD_EVERY = 100


class Runner:
    def __init__(
        self,
        settings: ServiceSettings,
        service_id: uuid.UUID,
        outbox: Outbox,
        kinds: dict[str, LoadedKind],
    ) -> None:
        self.settings = settings
        self.service_id = service_id
        self.outbox = outbox
        self.kinds = kinds
        self.running = Registry()
        self.last_started_at = 0.0  # Unix time of the latest start (``metrics.LAST_START``)
        self.stop_memory = StopMemory(settings.stopped_ids_ttl_s)
        self._background: set[asyncio.Task[None]] = set()
        self.gc = GcPolicy()
        self.start_log = StartLog()
        self.declines = Declines(service_id, outbox, self.spawn)
        self.probation = Probation(settings, service_id, outbox, kinds, self.running, self._run, self.fail, self.spawn)

    # --- start -------------------------------------------------------------------------

    async def admit(self, delivery: Delivery) -> None:
        """Start the observer a delivery names, or settle the delivery if it must not run here:
        called by the service's inbox (``inbox.py``), in the order the starts arrived."""
        body, channel, tag, redelivered, session = (
            delivery.body,
            delivery.channel,
            delivery.tag,
            delivery.redelivered,
            delivery.session,
        )
        try:
            start = decode_start(body)
        except DecodeError as e:
            logger.error("dead-lettering a malformed start message (delivery %s): %s", tag, e)
            await settle(session.reject(channel, tag))
            return
        oid = start.observer_id
        if self.stop_memory.eats(start.observer_id, start.life):
            logger.info("observer %s was stopped before its start arrived: acking the start", oid)
            report = ObserverStopped(observer_id=oid, service_id=self.service_id, reason="stopped before start")
            self.spawn(ack_once_confirmed(session, channel, tag, self.outbox.put_confirmed(report)))
            return
        current = self.running.get(oid)
        if current is not None and current.session is session:
            logger.warning("duplicate start message for observer %s, already running here: acking it", oid)
            await settle(session.ack(channel, tag))
            return
        loaded = self.kinds.get(start.kind)
        if loaded is None:
            lacks = f"kind {start.kind!r} is not installed here (this service has {', '.join(sorted(self.kinds))})"
            self.declines.decline(delivery, oid, start.pool, "kind", f"{self.settings.service_name}: {lacks}")
            return
        isolation = start.isolation or loaded.kind.isolation
        if isolation == "process" and self.running.children() >= self.settings.process_slots:
            slots = f"all {self.settings.process_slots} process slot(s) are taken"
            if self.settings.process_slots == 0:
                slots = "it has no process slots (ORCH_PROCESS_SLOTS=0)"
            self.declines.decline(delivery, oid, start.pool, "process slot", f"{self.settings.service_name}: {slots}")
            return
        try:
            args = loaded.kind.parse_args(start.args)
        except ValidationError as e:
            error = f"invalid args for kind {start.kind!r}: {e.errors()[:3]}"
            logger.error("observer %s cannot start: %s; dead-lettering its start", oid, error)
            metrics.FAILURES.inc()
            self.outbox.put(ObserverFailed(observer_id=oid, service_id=self.service_id, reason=error))
            await settle(session.reject(channel, tag))
            return
        kind = loaded.kind.name  # one string for all observers of the kind, not one each
        # A child of the publish's span (the start's headers); its report links to it.
        with tracing.consumer_span("start observer", delivery.headers, self._span_attributes(oid, kind)) as trace:
            ctx = Context(oid, start.name, kind, self.service_id, session)
            running = Running(oid, body, channel, tag, session, ctx)
            running.isolation = isolation
            self._run(running, loaded, args)
            self.running.add(running)
            self.last_started_at = time.time()
            self._report_started(running, redelivered, trace)
        logger.log(
            self.start_log.level(),
            "observer %s (%s %s) started, redelivered=%s",
            oid,
            start.kind,
            start.name,
            redelivered,
        )

    def _span_attributes(self, oid: uuid.UUID, kind: str) -> dict[str, str | int | bool]:
        """What a ``start observer`` span says (never the args), built only while traced."""
        if not tracing.active():
            return {}
        return {
            "orch.observer.id": str(oid),
            "orch.observer.kind": kind,
            "orch.service.name": self.settings.service_name,
            "orch.service.id": str(self.service_id),
        }

    def _report_started(self, running: Running, redelivered: bool, trace: tracing.Carrier | None = None) -> None:
        self.outbox.put(
            StartedReport(
                running.observer_id,
                self.service_id,
                running.session.id,
                redelivered,
                "process" if running.isolation == "process" else "async",
                trace,
            ),
            running.session,  # true only while that session lives
        )

    # --- stop --------------------------------------------------------------------------

    def on_stop(self, stop: StopObservers) -> None:
        """Start stopping what ``stop`` names (``stop_many``), in the background."""
        if stop.hand_over:
            self.spawn(self.hand_over(stop.observer_ids, stop.session_id, stop.reason))
        else:
            self.spawn(self.stop_many(stop.observer_ids, stop.service_id, stop.reason, stop.session_id, stop.lives))

    async def stop_many(
        self,
        observer_ids: list[uuid.UUID],
        target: uuid.UUID | None,
        reason: str,
        target_session: uuid.UUID | None = None,
        lives: list[int] | None = None,
    ) -> None:
        """Stop the observers named here: cancel them all, wait one bounded grace, report,
        and ack each start once the reports are confirmed. A stop targeted at another
        service, or at a copy held in another session of this one, is not ours to act on."""
        if target is not None and target != self.service_id:
            return
        ending: list[Running] = []
        for i, observer_id in enumerate(observer_ids):
            running = self.running.get(observer_id)
            if running is not None and target_session is not None and running.session.id != target_session:
                logger.info("ignoring a stop of observer %s aimed at an older copy (%s)", observer_id, reason)
            elif running is not None:
                if running.ended_by is not None:
                    continue  # named twice: acked twice, its start's second ack would close the channel
                running.ended_by = "stop"
                ending.append(running)
            elif target is None and lives is not None:
                # Remember a broadcast stop: the start may be on its way here (redistribution).
                # A targeted stop is about one delivery this service no longer holds; remembering
                # it could later throw away a legitimate start of the observer.
                self.stop_memory.remember(observer_id, lives[i])
        await self.end(ending)
        if not ending:
            return
        # Report first, ack once the broker confirmed the reports: acked first, a crash in
        # between would leave the observer OnDeleting for ever with no copy anywhere. Not
        # acked, its start is requeued with a dead session and the next service's start report
        # is answered with a stop (the manager knows it is OnDeleting or Deleted).
        confirmed = None
        for running in ending:
            report = ObserverStopped(observer_id=running.observer_id, service_id=self.service_id, reason=reason)
            confirmed = self.outbox.put_confirmed(report)
        assert confirmed is not None
        if not await until_confirmed(confirmed, {r.session for r in ending}):
            logger.warning("%d observer(s) stopped but not reported: their starts go back to the queue", len(ending))
            return
        for i, running in enumerate(ending):
            await settle(running.session.ack(running.channel, running.tag))
            if i % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)  # let heartbeats and the lease through during a big stop
        self.gc.ended(len(ending), len(self.running))
        logger.info("%d observer(s) stopped (%s)", len(ending), reason)

    async def hand_over(self, observer_ids: list[uuid.UUID], session_id: uuid.UUID | None, reason: str) -> None:
        """End these observers here, then give their starts back to the queue for another
        service (the balancer, a drain): ended first, so two copies never run at once."""
        ending = [
            running
            for observer_id in dict.fromkeys(observer_ids)
            if (running := self.running.get(observer_id)) is not None
            and running.ended_by is None
            and (session_id is None or running.session.id == session_id)
        ]
        for running in ending:
            running.ended_by = "handed over"
        await self.end(ending)
        by_session: dict[Session, list[uuid.UUID]] = {}
        for running in ending:
            by_session.setdefault(running.session, []).append(running.observer_id)
        # Reported before the starts go back: one the broker gives back to this service is
        # started and reported after it, so the manager never takes a copy running here off this service.
        for session, ids in by_session.items():
            report = ObserversHandedOver(
                service_id=self.service_id, session_id=session.id, observer_ids=ids, reason=reason
            )
            self.outbox.put(report, session)  # true only while that session lives
        for i, running in enumerate(ending):
            await settle(running.session.requeue(running.channel, running.tag))
            if i % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)
        if ending:
            self.gc.ended(len(ending), len(self.running))
            logger.info("handed %d observer(s) over (%s)", len(ending), reason)

    async def fence(self, session: Session) -> list[uuid.UUID]:
        """Cancel every observer started from a session that died. Their deliveries cannot
        be settled any more; the broker has already put them back in the queue. Observers
        not cancelled yet cannot act meanwhile: ``ensure_lease`` refuses on a closed session."""
        fenced = [r for r in self.running.values() if r.session is session]
        # Children first: an async observer stopped acting at the lease's revoke, a child acts
        # on the deadline it was sent until it is killed (docs/design.md, invariant 2).
        fenced.sort(key=lambda r: r.isolation != "process")
        for i, running in enumerate(fenced):
            running.ended_by = "fenced"
            if running.task is not None:
                running.task.cancel()
            running.ctx.request_stop()
            self.running.remove(running.observer_id)
            if i % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)  # unwinding thousands of tasks at once starves the loop
        if fenced:
            metrics.FENCED.inc(len(fenced))
            logger.warning("fenced %d observer(s): their session is gone", len(fenced))
            # Let them unwind (briefly: none of them can act any more) so that the collection
            # after the fence finds their tasks finished and frees them.
            tasks = [r.task for r in fenced if r.task is not None and not r.task.done()]
            if tasks:
                await asyncio.wait(tasks, timeout=_FENCE_UNWIND_S)
        return [r.observer_id for r in fenced]

    async def end_all(self) -> list[uuid.UUID]:
        """The handoff (a graceful stop of the service): end every observer. Their starts are
        not settled here: the caller gives them all back at once (``Session.requeue_held``)
        once this returns. Not ``hand_over``, which gives a few to other services."""
        handed = list(self.running.values())
        for running in handed:
            running.ended_by = "handoff"
        await self.end(handed)
        return [r.observer_id for r in handed]

    def inventory(self, session: Session) -> list[uuid.UUID]:
        return [oid for oid, running in self.running.items() if running.session is session]

    def _run(self, running: Running, loaded: LoadedKind, args: Any) -> None:
        running.task = asyncio.create_task(
            supervise(running, loaded, args, self.settings, self.outbox, self._on_ended),
            name=f"observer {running.observer_id}",
        )

    # --- internals ---------------------------------------------------------------------

    async def end(self, ending: list[Running]) -> None:
        """Cancel the tasks and wait one bounded grace for all of them to finish."""
        tasks = set()
        for running in ending:
            self.running.remove(running.observer_id)
            running.ctx.request_stop()
            if running.task is not None and not running.task.done():
                running.task.cancel()
                tasks.add(running.task)
        if not tasks:
            return
        _, stuck = await asyncio.wait(tasks, timeout=self.settings.stop_grace_s)
        if stuck:
            logger.error(
                "%d observer(s) ignored cancellation for %.1fs (e.g. %s); releasing their deliveries anyway",
                len(stuck),
                self.settings.stop_grace_s,
                next(iter(stuck)).get_name(),
            )

    def _on_ended(self, running: Running, outcome: BaseException | None) -> None:
        """Called by an observer's own task as it ends (``supervise``), with what ended it."""
        if running.task is asyncio.current_task():
            running.task = None  # ended: nothing is left to cancel or wait for
        cancelled = isinstance(outcome, asyncio.CancelledError)
        if running.isolating:
            # Paused on purpose, to run again in a child process: cancelled, or, having
            # ignored that, fenced (``probation.py``).
            return
        if running.ended_by is not None:
            if outcome is not None and not cancelled:
                logger.debug("observer %s ended with %r", running.observer_id, outcome)
            return
        if running.session.closed.is_set() or running.session.lease.revoked():
            # The session died under it (or is dying: the holding thread revoked the lease
            # and the session's end is on its way to this loop with the real reason): fencing
            # ends it, this is no failure of its own. Failing the session here instead would
            # win that race with "observer X hit a lapsed lease" as the reason, an ERROR that
            # blames one observer for a connection the broker closed.
            return
        if isinstance(outcome, LeaseLost):
            logger.error("observer %s hit a lapsed lease: fencing the session", running.observer_id)
            running.session.fail(f"observer {running.observer_id}: {outcome}")
            return
        if cancelled:
            reason = "observer task was cancelled from inside"
        elif isinstance(outcome, ObserverGaveUp):
            reason = str(outcome)
        elif outcome is None:
            reason = "observer task ended"
        else:
            reason = f"{type(outcome).__name__}: {outcome}"
        self.fail(running, reason)

    def fail(self, running: Running, reason: str) -> None:
        """End it Failed: said to the manager, its start dead-lettered to the pool's error
        queue (kept for inspection, never run again)."""
        running.ended_by = "failed"
        logger.error("observer %s failed: %s", running.observer_id, reason)
        metrics.FAILURES.inc()
        self.running.remove(running.observer_id)
        self.gc.ended(1, len(self.running))
        self.outbox.put(
            ObserverFailed(observer_id=running.observer_id, service_id=self.service_id, reason=reason[:MAX_ERROR_CHARS])
        )
        self.spawn(settle(running.session.reject(running.channel, running.tag)))

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background, kept referenced until it ends."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
