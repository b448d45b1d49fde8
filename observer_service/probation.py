"""Probation on the service's side: an observer the manager put on probation
(``IsolateObservers``) is moved, in place, into a child process of its own.

Its start delivery stays held throughout, so nobody else may take it. It is paused (its task
cancelled) before it waits for a free process slot: a suspect never runs in the service's own
process meanwhile, and the API says it is paused (docs/observers.md, "Retries, failure,
probation").
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
from shared.kinds import LoadedKind
from shared.messages import ObserverIsolated
from shared.settings import ServiceSettings

logger = logging.getLogger(__name__)

_SLOT_POLL_S = 1.0

Run = Callable[[Running, LoadedKind, Any], None]
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
        spawn: Spawn,
    ) -> None:
        self.settings = settings
        self.service_id = service_id
        self.outbox = outbox
        self.kinds = kinds
        self.running = running
        self._run = run  # the runner's: starts an observer's task (``supervise``) again
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
            if running.task is not None and not running.task.done():
                running.task.cancel()
                _, stuck = await asyncio.wait({running.task}, timeout=self.settings.stop_grace_s)
                if stuck:
                    logger.error("observer %s ignored cancellation: cannot move it into a child process", oid)
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
            self._run(running, loaded, loaded.kind.parse_args(running.start().args))
            logger.warning("observer %s runs in a child process now (%s)", oid, reason)
            self.outbox.put(ObserverIsolated(observer_id=oid, service_id=self.service_id), running.session)
        finally:
            running.isolating = False

    def _current(self, running: Running) -> bool:
        return running.ended_by is None and self.running.get(running.observer_id) is running
