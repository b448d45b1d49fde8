"""Each operation of the API as a ``Call``: the request to send and how to read its answer,
with no I/O, so the sync ``Client`` and the ``AsyncClient`` send the same calls and retry them
by the same rules (``next_attempt``).

Retries, bounded by the client's ``retries``:
* a 503 is sent again after its ``Retry-After`` (the manager says when to come back; capped
  at ``MAX_WAIT_S``);
* a request that never reached the manager (no connection) is sent again after a backoff;
* one that may have reached it (the answer was lost) is sent again only when that is safe:
  reads, and the calls that know how to recognise their own earlier success, a create (a 409
  for its own name returns that observer) and a stop (a 409 "already Deleted" returns it).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

import httpx

from orchestrator_client import models
from orchestrator_client.errors import Conflict, OrchestratorError, Unreachable, api_error
from orchestrator_client.models import parse

T = TypeVar("T")

MAX_WAIT_S = 30.0
EVENTS_PAGE = 1000  # the most the API gives at once
FIRST_BACKOFF_S = 0.2

# An observer by id, or by name (the live one with that name, else the latest).
Ref = uuid.UUID | str


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    read: Callable[[Any], T]
    params: Mapping[str, Any] = field(default_factory=dict)
    body: Any = None
    # Safe to send again when an answer was lost (the request may have been applied).
    resendable: bool = False
    # After such a resend met 409: the call that finds this call's own earlier result.
    recover: Callable[[], Call[T]] | None = None

    def query(self) -> dict[str, Any]:
        return {k: v for k, v in self.params.items() if v is not None}

    def result(self, response: httpx.Response) -> T:
        if response.is_error:
            raise api_error(response.status_code, detail(response))
        try:
            data = response.json() if response.content else None
        except ValueError as e:
            raise OrchestratorError(f"the answer of {response.url} is not JSON: is it the manager's API?") from e
        return self.read(data)


def detail(response: httpx.Response) -> str:
    """The API's ``{"detail": ...}``; a proxy in front of it may answer anything else."""
    try:
        found = response.json().get("detail")
    except (ValueError, AttributeError):
        found = None
    if found is None:
        return response.text.strip()[:500] or response.reason_phrase
    return found if isinstance(found, str) else json.dumps(found)


class Attempts(Generic[T]):
    """The sends of one call: after each, what to do next (``after``)."""

    def __init__(self, call: Call[T], retries: int) -> None:
        self.call = call
        self.retries = retries
        self.sent = 0
        self.answer_lost = False  # a request that may have been applied was sent again

    def after(self, response: httpx.Response | None, error: httpx.TransportError | None) -> float | Call[T] | None:
        """Seconds to wait before sending the call again; or the call that finds its own
        earlier result (a 409 after a lost answer); or None: ``response`` (or ``error``) is
        the outcome."""
        self.sent += 1
        if response is not None and response.status_code == 409 and self.answer_lost and self.call.recover:
            own: Call[T] = self.call.recover()
            return own
        if self.sent > self.retries:
            return None
        if response is not None:
            return _retry_after(response) if response.status_code == 503 else None
        never_sent = isinstance(error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
        if not never_sent and not self.call.resendable:
            return None
        self.answer_lost = self.answer_lost or not never_sent
        return min(MAX_WAIT_S, FIRST_BACKOFF_S * 2.0 ** (self.sent - 1))


def unreachable(base_url: str, timeout: float, error: httpx.TransportError) -> Unreachable:
    if isinstance(error, httpx.TimeoutException):
        message = f"the manager at {base_url} did not answer within {timeout:g}s ({type(error).__name__})"
        return Unreachable(message, "timeout")
    if "CERTIFICATE_VERIFY_FAILED" in str(error):
        message = f"the manager at {base_url} has a certificate this client cannot verify: {error}"
        return Unreachable(message, "certificate")
    return Unreachable(f"cannot reach the manager at {base_url}: {error or type(error).__name__}", "connect")


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(MAX_WAIT_S, max(0.0, float(response.headers.get("Retry-After", "1"))))
    except ValueError:  # an HTTP date: the manager never sends one, a proxy might
        return 1.0


# --- the operations ---------------------------------------------------------------------


def observer_spec(
    name: str,
    kind: str,
    args: Mapping[str, Any] | None = None,
    *,
    pool: str | None = None,
    retry: Mapping[str, Any] | None = None,
    isolation: str | None = None,
    memory_limit_mb: float | None = None,
    start_at: datetime | None = None,
    stop_at: datetime | None = None,
    run_for_s: float | None = None,
    rebalance: bool | None = None,
) -> dict[str, Any]:
    """The body of a create (one item of a bulk create); options left None take the API's
    default (``retry`` holds only the policy's fields to override)."""
    optional = {
        "pool": pool,
        "retry": dict(retry) if retry is not None else None,
        "isolation": isolation,
        "memory_limit_mb": memory_limit_mb,
        "start_at": start_at.isoformat() if start_at else None,
        "stop_at": stop_at.isoformat() if stop_at else None,
        "run_for_s": run_for_s,
        "rebalance": rebalance,
    }
    return {"name": name, "kind": kind, "args": dict(args or {})} | {k: v for k, v in optional.items() if v is not None}


def _observer(data: Any) -> models.Observer:
    return parse(models.Observer, data)


def _observers(data: Any) -> list[models.Observer]:
    return [parse(models.Observer, o) for o in data["items"]]


def create(spec: Mapping[str, Any]) -> Call[models.Observer]:
    def own(page: Any) -> models.Observer:
        # The live observer of that name (there is one at most) is ours if it is what we sent:
        # its kind, and our args among its own (the kind may have filled in its defaults).
        sent = spec.get("args", {})
        for item in page["items"]:
            live = item["status"] not in ("Deleted", "Failed")
            if live and item["kind"] == spec["kind"] and all(item["args"].get(k) == v for k, v in sent.items()):
                return _observer(item)
        raise Conflict(409, f"the name {spec['name']!r} is in use by another observer")

    def find_own() -> Call[models.Observer]:
        return Call("GET", "/api/observers", own, params={"name": spec["name"], "sort": "created", "limit": 1000})

    return Call("POST", "/api/observers", _observer, body=dict(spec), resendable=True, recover=find_own)


def bulk_create(specs: Sequence[Mapping[str, Any]]) -> Call[list[models.Observer]]:
    # Not resent when the answer is lost: all or nothing, a resend meets 409 for every name.
    return Call("POST", "/api/observers/bulk", _observers, body={"observers": [dict(s) for s in specs]})


def get(observer_id: uuid.UUID) -> Call[models.Observer]:
    return Call("GET", f"/api/observers/{observer_id}", _observer, resendable=True)


def page(filters: Mapping[str, Any], limit: int, cursor: str | None) -> Call[tuple[list[models.Observer], str | None]]:
    def read(data: Any) -> tuple[list[models.Observer], str | None]:
        return _observers(data), data["next_cursor"]

    params = {k: str(v) if isinstance(v, uuid.UUID) else v for k, v in filters.items()}
    return Call("GET", "/api/observers", read, params=params | {"limit": limit, "cursor": cursor}, resendable=True)


def by_name(name: str) -> Call[uuid.UUID]:
    """The id of the observer called ``name``: the live one, else the latest."""

    def read(data: Any) -> uuid.UUID:
        items = data["items"]
        if not items:
            looks_short = re.fullmatch(r"[0-9a-f]{4,35}", name) is not None
            hint = " (if it is a shortened id: ids are needed in full, 36 characters)" if looks_short else ""
            raise api_error(404, f"no observer named {name!r}{hint}")
        live = [o for o in items if o["status"] not in ("Deleted", "Failed")]
        return uuid.UUID((live or items)[-1]["id"])

    return Call("GET", "/api/observers", read, params={"name": name, "limit": 1000}, resendable=True)


def stop(observer_id: uuid.UUID) -> Call[models.Observer]:
    def stopped(data: Any) -> models.Observer:
        observer = _observer(data)
        if observer.status != "Deleted":
            raise Conflict(409, f"observer {observer_id} is already {observer.status}; nothing to stop")
        return observer

    def find_own() -> Call[models.Observer]:
        return Call("GET", f"/api/observers/{observer_id}", stopped)

    return Call("DELETE", f"/api/observers/{observer_id}", _observer, resendable=True, recover=find_own)


def bulk_stop(ids: Sequence[uuid.UUID]) -> Call[models.BulkStopResult]:
    # Stopping is idempotent in bulk: a resend lists the done ones as stopping or final.
    return Call(
        "POST",
        "/api/observers/bulk-stop",
        lambda data: parse(models.BulkStopResult, data),
        body={"ids": [str(i) for i in ids]},
        resendable=True,
    )


def restart(observer_id: uuid.UUID) -> Call[models.Observer]:
    return Call("POST", f"/api/observers/{observer_id}/restart", _observer)


def reschedule(observer_id: uuid.UUID, start_at: datetime) -> Call[models.Observer]:
    return Call(
        "PATCH", f"/api/observers/{observer_id}", _observer, body={"start_at": start_at.isoformat()}, resendable=True
    )


def events(observer_id: uuid.UUID, limit: int, after: int | None) -> Call[list[models.Event]]:
    return Call(
        "GET",
        f"/api/observers/{observer_id}/events",
        lambda data: [parse(models.Event, e) for e in data],
        params={"limit": limit, "after": after},
        resendable=True,
    )


def services() -> Call[list[models.Service]]:
    return Call("GET", "/api/services", lambda data: [parse(models.Service, s) for s in data], resendable=True)


def service_by_name(name: str) -> Call[uuid.UUID]:
    def read(data: Any) -> uuid.UUID:
        for svc in data:  # the API lists alive services first
            if svc["name"] == name:
                return uuid.UUID(svc["id"])
        raise api_error(404, f"no service named {name!r}")

    return Call("GET", "/api/services", read, resendable=True)


def set_draining(service_id: uuid.UUID, action: str) -> Call[models.Service]:
    # Draining and uncordoning are idempotent: a resend sets what is already set.
    return Call(
        "POST", f"/api/services/{service_id}/{action}", lambda data: parse(models.Service, data), resendable=True
    )


def stats() -> Call[models.Stats]:
    return Call("GET", "/api/stats", lambda data: parse(models.Stats, data), resendable=True)


def history() -> Call[models.History]:
    return Call("GET", "/api/history", lambda data: parse(models.History, data), resendable=True)


def kinds() -> Call[list[models.Kind]]:
    return Call("GET", "/api/kinds", lambda data: [parse(models.Kind, k) for k in data], resendable=True)


def as_uuid(value: Ref) -> uuid.UUID | None:
    """``value`` as an id, or None when it is a name."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(value)
    except ValueError:
        return None
