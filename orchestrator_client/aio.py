"""``AsyncClient``: the manager's API from asyncio, method for method as ``client.Client``
(the same calls, the same retries)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx

from orchestrator_client import calls, models
from orchestrator_client.calls import Attempts, Call, Ref
from orchestrator_client.client import http_options

T = TypeVar("T")


class AsyncClient:
    """``async with AsyncClient("https://manager:8000", token=...) as client:``; as ``Client``."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        ca_file: str | None = None,
        retries: int = 4,
    ) -> None:
        self.base_url = url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self._http = httpx.AsyncClient(base_url=self.base_url, **http_options(token, timeout, ca_file))

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    async def send(self, call: Call[T]) -> T:
        attempts = Attempts(call, self.retries)
        while True:
            response, error = None, None
            try:
                response = await self._http.request(call.method, call.path, params=call.query(), json=call.body)
            except httpx.TransportError as e:
                error = e
            step = attempts.after(response, error)
            if isinstance(step, Call):
                return await self.send(step)
            if step is None:
                if error is not None:
                    raise calls.unreachable(self.base_url, self.timeout, error) from error
                assert response is not None
                return call.result(response)
            await asyncio.sleep(step)

    # --- observers -----------------------------------------------------------------------

    async def create(
        self, name: str, kind: str, args: Mapping[str, Any] | None = None, **options: Any
    ) -> models.Observer:
        """Options: pool, retry, isolation, memory_limit_mb, start_at, stop_at, run_for_s,
        rebalance (``calls.observer_spec``)."""
        return await self.send(calls.create(calls.observer_spec(name, kind, args, **options)))

    async def bulk_create(self, specs: Sequence[Mapping[str, Any]]) -> list[models.Observer]:
        """Up to 1,000 at once, all or nothing; each spec from ``observer_spec``."""
        return await self.send(calls.bulk_create(specs))

    async def observer_id(self, observer: Ref) -> uuid.UUID:
        """An id as it is; a name: the live observer's id, else the latest one's."""
        found = calls.as_uuid(observer)
        return found if found is not None else await self.send(calls.by_name(str(observer)))

    async def get(self, observer: Ref) -> models.Observer:
        return await self.send(calls.get(await self.observer_id(observer)))

    async def observers(
        self, *, page_size: int = 100, service: Ref | None = None, **filters: Any
    ) -> AsyncIterator[models.Observer]:
        """Every observer that matches, page after page. Filters: status, kind, pool,
        service (id or name), name (exact), q (a substring of the name), sort."""
        if service is not None:
            filters["service_id"] = await self.service_id(service)
        cursor: str | None = None
        while True:
            items, cursor = await self.send(calls.page(filters, page_size, cursor))
            for item in items:
                yield item
            if cursor is None:
                return

    async def stop(self, observer: Ref) -> models.Observer:
        return await self.send(calls.stop(await self.observer_id(observer)))

    async def bulk_stop(self, observers: Sequence[Ref]) -> models.BulkStopResult:
        return await self.send(calls.bulk_stop([await self.observer_id(o) for o in observers]))

    async def restart(self, observer: Ref) -> models.Observer:
        return await self.send(calls.restart(await self.observer_id(observer)))

    async def reschedule(self, observer: Ref, start_at: datetime) -> models.Observer:
        return await self.send(calls.reschedule(await self.observer_id(observer), start_at))

    async def events(self, observer: Ref, *, after: int | None = None) -> list[models.Event]:
        """Its history, oldest first (after the event id ``after``, if given)."""
        observer_id, found = await self.observer_id(observer), []
        while True:
            page = await self.send(calls.events(observer_id, calls.EVENTS_PAGE, after))
            found += page
            if len(page) < calls.EVENTS_PAGE:
                return found
            after = page[-1].id

    # --- the fleet -----------------------------------------------------------------------

    async def services(self) -> list[models.Service]:
        return await self.send(calls.services())

    async def service_id(self, service: Ref) -> uuid.UUID:
        found = calls.as_uuid(service)
        return found if found is not None else await self.send(calls.service_by_name(str(service)))

    async def drain(self, service: Ref) -> models.Service:
        return await self.send(calls.set_draining(await self.service_id(service), "drain"))

    async def uncordon(self, service: Ref) -> models.Service:
        return await self.send(calls.set_draining(await self.service_id(service), "uncordon"))

    async def stats(self) -> models.Stats:
        return await self.send(calls.stats())

    async def history(self) -> models.History:
        return await self.send(calls.history())

    async def kinds(self) -> list[models.Kind]:
        return await self.send(calls.kinds())
