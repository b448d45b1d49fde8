"""The typed client's retry rules and models, without a manager (orchestrator_client.calls,
orchestrator_client.models); tests/system/test_client.py runs them against a real one."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import httpx
import pytest

from orchestrator_client import calls, models
from orchestrator_client.calls import Attempts, Call
from orchestrator_client.errors import Conflict

REQUEST = httpx.Request("POST", "http://manager/api/observers")


def answer(status: int, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers=headers, json={"detail": "x"}, request=REQUEST)


def test_a_503_waits_its_retry_after_as_often_as_allowed() -> None:
    attempts = Attempts(calls.bulk_create([]), retries=2)
    assert attempts.after(answer(503, **{"Retry-After": "5"}), None) == 5.0
    assert attempts.after(answer(503, **{"Retry-After": "999"}), None) == calls.MAX_WAIT_S
    assert attempts.after(answer(503), None) is None  # the third answer is the outcome


def test_other_answers_are_the_outcome() -> None:
    for status in (200, 201, 400, 404, 409, 422, 500):
        assert Attempts(calls.create({"name": "n", "kind": "k"}), retries=3).after(answer(status), None) is None


def test_a_lost_answer_is_resent_only_where_that_is_safe() -> None:
    lost = httpx.RemoteProtocolError("Server disconnected without sending a response.")
    never_sent = httpx.ConnectError("refused")
    bulk = Attempts(calls.bulk_create([]), retries=3)  # a resend would meet 409 for every name
    assert bulk.after(None, lost) is None
    assert Attempts(calls.bulk_create([]), retries=3).after(None, never_sent) == calls.FIRST_BACKOFF_S
    create = Attempts(calls.create({"name": "n", "kind": "k"}), retries=3)
    assert create.after(None, lost) == calls.FIRST_BACKOFF_S
    recover = create.after(answer(409), None)  # its own name: look for its own observer
    assert isinstance(recover, Call) and recover.method == "GET" and recover.params["name"] == "n"


def test_a_409_without_a_lost_answer_is_a_conflict() -> None:
    create = Attempts(calls.create({"name": "n", "kind": "k"}), retries=3)
    assert create.after(None, httpx.ConnectError("refused")) is not None  # never reached the manager
    assert create.after(answer(409), None) is None


def test_the_own_observer_is_found_by_kind_and_args() -> None:
    def item(kind: str, args: dict[str, object], status: str = "Processing") -> dict[str, object]:
        now = datetime.now(UTC).isoformat()
        return {
            **dict.fromkeys(["service_id", "service_name", "last_error", "retry", "isolation", "memory_limit_mb"]),
            "id": str(uuid.uuid4()),
            "name": "n",
            "kind": kind,
            "args": args,
            "pool": "default",
            "status": status,
            "attempts": 1,
            "created_at": now,
            "modified_at": now,
        }

    find = calls.create({"name": "n", "kind": "ticker", "args": {"interval_s": 5}}).recover
    assert find is not None
    mine = item("ticker", {"interval_s": 5, "filled_in": True})
    assert find().read({"items": [item("ticker", {"interval_s": 5}, "Deleted"), mine]}).id == uuid.UUID(mine["id"])  # type: ignore[arg-type]
    for other in (item("ticker", {"interval_s": 6}), item("http_poll", {"interval_s": 5})):
        with pytest.raises(Conflict):  # someone else's observer is not taken for ours
            find().read({"items": [other]})


def test_models_read_and_write_the_api_json() -> None:
    data = {
        "id": str(uuid.uuid4()),
        "at": "2026-12-03T17:00:00.123456Z",
        "event": "started",
        "service_id": None,
        "from_service_id": str(uuid.uuid4()),
        "detail": None,
        "added_by_a_newer_manager": 1,
    }
    event = models.parse(models.Event, data | {"id": 7})
    assert event.at == datetime(2026, 12, 3, 17, 0, 0, 123456, tzinfo=UTC)
    assert isinstance(event.from_service_id, uuid.UUID)
    assert models.to_json(event) == {k: v for k, v in data.items() if k != "added_by_a_newer_manager"} | {
        "id": 7,
        "at": "2026-12-03T17:00:00.123456+00:00",
    }
