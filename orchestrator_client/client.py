"""``Client``: the manager's API from synchronous Python. Every method sends the calls of
``orchestrator_client.calls`` (with its retries) and answers typed models; ``aio.py`` is the
same for asyncio, method for method."""

from __future__ import annotations

import ssl
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx

from orchestrator_client import calls, models
from orchestrator_client.calls import Attempts, Call, Ref

T = TypeVar("T")


def http_options(token: str | None, timeout: float, ca_file: str | None) -> dict[str, Any]:
    """httpx's options for both clients: the bearer token, and an https:// manager's
    certificate and host name verified against ``ca_file`` (a private CA), else the CAs
    httpx trusts."""
    return {
        "headers": {"Authorization": f"Bearer {token}"} if token else {},
        "timeout": timeout,
        "verify": ssl.create_default_context(cafile=ca_file) if ca_file else True,
    }


class Client:
    """``Client("https://manager:8000", token=..., ca_file=...)``; a 503 or a lost answer is
    retried up to ``retries`` times (``calls``), then raised (``errors``)."""

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
        self._http = httpx.Client(base_url=self.base_url, **http_options(token, timeout, ca_file))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def send(self, call: Call[T]) -> T:
        attempts = Attempts(call, self.retries)
        while True:
            response, error = None, None
            try:
                response = self._http.request(call.method, call.path, params=call.query(), json=call.body)
            except httpx.TransportError as e:
                error = e
            step = attempts.after(response, error)
            if isinstance(step, Call):
                return self.send(step)
            if step is None:
                if error is not None:
                    raise calls.unreachable(self.base_url, self.timeout, error) from error
                assert response is not None
                return call.result(response)
            time.sleep(step)

    # --- observers -----------------------------------------------------------------------

    def create(self, name: str, kind: str, args: Mapping[str, Any] | None = None, **options: Any) -> models.Observer:
        """Options: pool, retry, isolation, memory_limit_mb, start_at, stop_at, run_for_s,
        rebalance (``calls.observer_spec``)."""
        return self.send(calls.create(calls.observer_spec(name, kind, args, **options)))

    def bulk_create(self, specs: Sequence[Mapping[str, Any]]) -> list[models.Observer]:
        """Up to 1,000 at once, all or nothing; each spec from ``observer_spec``."""
        return self.send(calls.bulk_create(specs))

    def observer_id(self, observer: Ref) -> uuid.UUID:
        """An id as it is; a name: the live observer's id, else the latest one's."""
        found = calls.as_uuid(observer)
        return found if found is not None else self.send(calls.by_name(str(observer)))

    def get(self, observer: Ref) -> models.Observer:
        return self.send(calls.get(self.observer_id(observer)))

    def observers(
        self, *, page_size: int = 100, service: Ref | None = None, **filters: Any
    ) -> Iterator[models.Observer]:
        """Every observer that matches, page after page. Filters: status, kind, pool,
        service (id or name), name (exact), q (a substring of the name), sort."""
        if service is not None:
            filters["service_id"] = self.service_id(service)
        cursor: str | None = None
        while True:
            items, cursor = self.send(calls.page(filters, page_size, cursor))
            yield from items
            if cursor is None:
                return

    def stop(self, observer: Ref) -> models.Observer:
        return self.send(calls.stop(self.observer_id(observer)))

    def bulk_stop(self, observers: Sequence[Ref]) -> models.BulkStopResult:
        return self.send(calls.bulk_stop([self.observer_id(o) for o in observers]))

    def restart(self, observer: Ref) -> models.Observer:
        return self.send(calls.restart(self.observer_id(observer)))

    def reschedule(self, observer: Ref, start_at: datetime) -> models.Observer:
        return self.send(calls.reschedule(self.observer_id(observer), start_at))

    def events(self, observer: Ref, *, after: int | None = None) -> list[models.Event]:
        """Its history, oldest first (after the event id ``after``, if given)."""
        observer_id, found = self.observer_id(observer), []
        while True:
            page = self.send(calls.events(observer_id, calls.EVENTS_PAGE, after))
            found += page
            if len(page) < calls.EVENTS_PAGE:
                return found
            after = page[-1].id

    # --- the fleet -----------------------------------------------------------------------

    def services(self) -> list[models.Service]:
        return self.send(calls.services())

    def service_id(self, service: Ref) -> uuid.UUID:
        found = calls.as_uuid(service)
        return found if found is not None else self.send(calls.service_by_name(str(service)))

    def drain(self, service: Ref) -> models.Service:
        return self.send(calls.set_draining(self.service_id(service), "drain"))

    def uncordon(self, service: Ref) -> models.Service:
        return self.send(calls.set_draining(self.service_id(service), "uncordon"))

    def stats(self) -> models.Stats:
        return self.send(calls.stats())

    def history(self) -> models.History:
        return self.send(calls.history())

    def kinds(self) -> list[models.Kind]:
        return self.send(calls.kinds())
