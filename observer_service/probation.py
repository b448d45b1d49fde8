"""Probation on the service's side: an observer the manager put on probation
(``IsolateObservers``) is moved, in place, into a child process of its own.

Its start delivery stays held throughout, so nobody else may take it. It is paused (its task
cancelled) before it waits for a free process slot: a suspect never runs in the service's own
process meanwhile, and the API says it is paused (docs/observers.md, "Retries, failure,
probation").

A body that ignores the cancellation for ``ORCH_STOP_GRACE_S`` is fenced: its context refuses
every side effect from then on (``ensure_lease`` raises), which ends a body that asks before it
acts. One that ends within another grace runs on in a child, with a fresh context; one that
does not cannot be moved, and is ended Failed, saying so (its start dead-lettered, so it runs
nowhere else while its task may live on here, unable to act through its context).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from observer_service.observer import Running
from observer_service.outbox import Outbox
from observer_service.registry import Registry
from observer_service.settings import ServiceSettings
from shared.kinds import LoadedKind
from shared.messages import ObserverIsolated

logger = logging.getLogger(__name__)

_SLOT_POLL_S = 1.0

Run = Callable[[Running, LoadedKind, Any], None]
Fail = Callable[[Running, str], None]
Spawn = Callable[[Coroutine[Any, Any, None]], None]


class Probation:
    def __init__(
        self,
        settings: ServiceSettings,
        service_id: uuid.UUID,
        outbox: Outbox,
        kinds: dict[str, LoadedKind],
        running: Registry,
        run: Run,
        fail: Fail,
        spawn: Spawn,
    ) -> None:
        self.settings = settings
        self.service_id = service_id
        self.outbox = outbox
        self.kinds = kinds
        self.running = running
        self._run = run  # the runner's: starts an observer's task (``supervise``) again
        self._fail = fail  # the runner's: ends it Failed, its start dead-lettered
        self._spawn = spawn

    def isolate(self, observer_ids: list[uuid.UUID], reason: str) -> None:
        """Run these observers in child processes from now on: each is restarted in place."""
        for observer_id in observer_ids:
            running = self.running.get(observer_id)
            if running is None or running.ended_by is not None or running.isolating:
                continue
            if running.isolation == "process":
                self.outbox.put(ObserverIsolated(observer_id=observer_id, service_id=self.service_id), running.session)
                continue
            running.isolating = True
            self._spawn(self._isolate(running, reason))

    async def _isolate(self, running: Running, reason: str) -> None:
        oid = running.observer_id
        try:
            if not await self._paused(running):
                return
            waited = False
            while self.running.children() >= self.settings.process_slots and self._current(running):
                if not waited:
                    logger.warning("observer %s on probation waits for a free process slot", oid)
                    waited = True
                await asyncio.sleep(_SLOT_POLL_S)
            if not self._current(running):
                return  # stopped or fenced meanwhile
            loaded = self.kinds[running.ctx.kind]
            running.isolation = "process"
            running.ctx = running.ctx.fresh()  # a fenced one would drop the child's emits
            self._run(running, loaded, loaded.kind.parse_args(running.start().args))
            logger.warning("observer %s runs in a child process now (%s)", oid, reason)
            self.outbox.put(ObserverIsolated(observer_id=oid, service_id=self.service_id), running.session)
        finally:
            running.isolating = False

    async def _paused(self, running: Running) -> bool:
        """Its task cancelled and ended, fenced if it ignored that; False if it ended Failed
        because it would not end at all."""
        task = running.task
        if task is None or task.done():
            return True
        task.cancel()
        grace = self.settings.stop_grace_s
        if not (await asyncio.wait({task}, timeout=grace))[1]:
            return True
        running.ctx.request_stop()
        logger.warning(
            "observer %s on probation ignored cancellation for %.1fs: fenced, its context allows no more side effects",
            running.observer_id,
            grace,
        )
        if not (await asyncio.wait({task}, timeout=grace))[1]:
            return True
        if self._current(running):
            self._fail(
                running,
                f"on probation it had to move into a child process, but its body ignored cancellation and then "
                f"its fence for {2 * grace:.0f}s: failed, its start dead-lettered; it was fenced (no side effects "
                "through its context) but its task may run on in the service's process until the service restarts",
            )
        return False

    def _current(self, running: Running) -> bool:
        return running.ended_by is None and self.running.get(running.observer_id) is running
