"""The built-in kinds ``http_poll``, ``websocket`` and ``periodic``: their pure logic in
process, then each one end to end (real manager, services, broker) against local servers."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ValidationError

from shared import egress, topology
from shared.backoff import backoff_delay
from shared.errors import EgressDenied, LeaseLost
from shared.kinds import BUILTIN_KINDS, http_poll, periodic, websocket
from shared.messages import RetryPolicy, StartObserver
from tests.local_servers import HttpServer, WsServer
from tools.harness import System, free_port, unique, wait_for

FUNCS = "tests.periodic_funcs"
NO_RETRY = {"max_attempts": 1}  # a body that raises is Failed at once, not restarted


@pytest.fixture(autouse=True)
def _periodic_may_call_the_test_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process runs of ``periodic`` below call ``tests.periodic_funcs``; the services
    of the end-to-end tests get the variable explicitly (the harness passes no ORCH_*)."""
    monkeypatch.setenv(periodic.ALLOWED_MODULES_ENV, FUNCS)


@pytest.fixture
def http_server() -> Iterator[HttpServer]:
    server = HttpServer()
    yield server
    server.close()


@pytest.fixture
def ws_server() -> Iterator[WsServer]:
    server = WsServer()
    yield server
    server.close()


# --- in process ------------------------------------------------------------------------


class FakeContext:
    def __init__(self) -> None:
        self.observer_id = uuid.uuid4()
        self.name = "test"
        self.kind = "test"
        self.service_id = uuid.uuid4()
        self.stopping = asyncio.Event()
        self.logger = logging.LoggerAdapter(logging.getLogger("test.kinds"), {})
        self.events: list[dict[str, Any]] = []
        self.lease_checks = 0

    def ensure_lease(self) -> None:
        self.lease_checks += 1

    async def emit(self, payload: dict[str, Any]) -> None:
        self.ensure_lease()
        self.events.append(payload)


async def run_until(
    kind: str, args: dict[str, Any], ctx: FakeContext, done: Callable[[], bool] = lambda: False, timeout: float = 30
) -> BaseException | None:
    """Run a kind's body until ``done()`` (then cancel it) or until it raises; its error."""
    observer_kind = BUILTIN_KINDS[kind]
    task: asyncio.Task[None] = asyncio.create_task(
        observer_kind.run(observer_kind.parse_args(args), ctx)  # type: ignore[arg-type]
    )
    deadline = time.monotonic() + timeout
    while not task.done() and not done():
        assert time.monotonic() < deadline, f"{kind} did neither finish nor reach the expected state"
        await asyncio.sleep(0.02)
    if not task.done():
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return None
    return task.exception()


@pytest.mark.parametrize(
    ("kind", "args", "field"),
    [
        ("ticker", {"log_file": "/tmp/ticks.log"}, "log_file"),  # no path on the host is the caller's
        ("periodic", {"function": "no_colon"}, "function"),
        ("periodic", {"function": "a.b:c:d"}, "function"),
        ("periodic", {"function": "1mod:f"}, "function"),
        ("periodic", {"function": "m:f", "timeout_s": 0}, "timeout_s"),
        ("periodic", {"function": "m:f", "surprise": 1}, "surprise"),
        ("http_poll", {"url": "ftp://example.com/"}, "url"),
        ("http_poll", {"url": "http://x/", "max_consecutive_errors": 0}, "max_consecutive_errors"),
        ("websocket", {"url": "http://x/"}, "url"),
        ("websocket", {"url": "ws://x/", "initial_backoff_s": 5, "max_backoff_s": 1}, "max_backoff_s"),
    ],
)
def test_bad_args_are_rejected(kind: str, args: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as error:
        BUILTIN_KINDS[kind].parse_args(args)
    assert field in str(error.value)


@pytest.mark.parametrize(
    ("kind", "args"),
    [
        ("periodic", {"function": "tests.periodic_funcs:record", "kwargs": {"path": "/tmp/x"}}),
        ("http_poll", {"url": "https://example.com/api?q=1", "headers": {"accept": "application/json"}}),
        ("websocket", {"url": "wss://example.com/ws", "subscribe": {"op": "subscribe"}}),
        ("websocket", {"url": "ws://127.0.0.1:9/", "subscribe": "ping", "max_consecutive_failures": None}),
    ],
)
def test_good_args_survive_the_managers_json_round_trip(kind: str, args: dict[str, Any]) -> None:
    parsed: BaseModel = BUILTIN_KINDS[kind].parse_args(args)
    stored = parsed.model_dump(mode="json")  # what the manager keeps and sends to services
    assert BUILTIN_KINDS[kind].parse_args(stored) == parsed
    assert BUILTIN_KINDS[kind].info().args_schema["additionalProperties"] is False


def test_backoff_doubles_up_to_the_cap_with_equal_jitter() -> None:
    assert [backoff_delay(n, 0.5, 3.0, 1.0) for n in (1, 2, 3, 4, 50, 10_000)] == [0.5, 1, 2, 3, 3, 3]
    assert backoff_delay(3, 0.5, 3.0, 0.0) == 1.0  # half of the base at the lowest
    # Unspread, a fleet cut at one instant retries in lockstep: the delays must differ.
    random_delays = {backoff_delay(50, 0.5, 2.0) for _ in range(20)}
    assert len(random_delays) > 1 and all(1.0 <= d <= 2.0 for d in random_delays)


def test_next_slot_skips_missed_slots() -> None:
    assert periodic.next_slot(100.0, 1.0, 0, 100.3) == 1
    assert periodic.next_slot(100.0, 1.0, 0, 103.5) == 4  # slots 1-3 passed during the call
    assert periodic.next_slot(100.0, 1.0, 4, 104.0) == 5  # never the slot just used


def test_message_parsing() -> None:
    assert websocket.parse('{"p": 1}') == {"p": 1}
    assert websocket.parse(b"[1, 2]") == [1, 2]
    assert websocket.parse("hello") == "hello"


async def test_periodic_calls_sync_and_async_functions_with_kwargs() -> None:
    ctx = FakeContext()
    args = {"function": f"{FUNCS}:add", "kwargs": {"a": 2, "b": 3}, "interval_s": 0.05}
    assert await run_until("periodic", args, ctx, lambda: len(ctx.events) >= 2) is None
    assert [(e["call"], e["result"]) for e in ctx.events[:2]] == [(1, 5), (2, 5)]
    assert ctx.lease_checks >= 4  # before each call and each emit

    ctx = FakeContext()
    args = {"function": f"{FUNCS}:opaque", "interval_s": 0.05}
    assert await run_until("periodic", args, ctx, lambda: len(ctx.events) >= 1) is None
    assert ctx.events[0]["result"] == "{1, 2}"  # not JSON: its repr


async def test_periodic_never_overlaps_and_skips_missed_slots(tmp_path: Path) -> None:
    ctx, log = FakeContext(), tmp_path / "calls.log"
    args = {"function": f"{FUNCS}:record", "kwargs": {"path": str(log), "sleep_s": 0.25}, "interval_s": 0.1}
    assert await run_until("periodic", args, ctx, lambda: len(ctx.events) >= 4) is None
    calls = [tuple(map(float, line.split()[1:])) for line in log.read_text().splitlines()]
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(calls))
    assert [e["call"] for e in ctx.events] == list(range(1, len(ctx.events) + 1))


async def test_periodic_cancels_an_async_call_at_its_timeout_and_gives_up(tmp_path: Path) -> None:
    ctx, log = FakeContext(), tmp_path / "sleepy.log"
    args = {
        "function": f"{FUNCS}:sleepy",
        "kwargs": {"path": str(log), "sleep_s": 30},
        "interval_s": 0.05,
        "timeout_s": 0.2,
        "max_consecutive_errors": 2,
    }
    error = await run_until("periodic", args, ctx)
    assert isinstance(error, periodic.PeriodicError)
    assert "2 consecutive errors" in str(error) and "timed out after 0.2s" in str(error)
    assert log.read_text().split() == ["start", "cancelled", "start", "cancelled"]
    assert [e["call"] for e in ctx.events] == [1]  # the last error raises instead of emitting
    assert "timed out" in ctx.events[0]["error"]


async def test_periodic_errors_and_sync_timeouts_raise() -> None:
    ctx = FakeContext()
    error = await run_until("periodic", {"function": f"{FUNCS}:fail", "interval_s": 0.05}, ctx)
    assert isinstance(error, periodic.PeriodicError) and "3 consecutive errors" in str(error)
    assert "ValueError: boom" in str(error) and len(ctx.events) == 2

    args = {"function": f"{FUNCS}:block", "kwargs": {"sleep_s": 1.0}, "timeout_s": 0.1}
    error = await run_until("periodic", args, FakeContext())
    assert isinstance(error, periodic.PeriodicError) and "thread cannot be killed" in str(error)


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        (f"{FUNCS}.no_such:f", f"cannot import module '{FUNCS}.no_such'"),
        (f"{FUNCS}:missing", "has no attribute 'missing'"),
        (f"{FUNCS}:NOT_A_FUNCTION", "not a function"),
    ],
)
async def test_periodic_reports_a_function_it_cannot_load(ref: str, message: str) -> None:
    error = await run_until("periodic", {"function": ref}, FakeContext())
    assert isinstance(error, periodic.PeriodicError) and message in str(error)


def test_periodic_calls_nothing_unless_the_operator_lists_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    for unset in ("", " , "):
        monkeypatch.setenv(periodic.ALLOWED_MODULES_ENV, unset)
        with pytest.raises(periodic.PeriodicError, match="calls no function: ORCH_PERIODIC_MODULES is unset"):
            periodic.resolve(f"{FUNCS}:add")
    monkeypatch.delenv(periodic.ALLOWED_MODULES_ENV)
    with pytest.raises(periodic.PeriodicError, match="ORCH_PERIODIC_MODULES is unset"):
        periodic.resolve("os:getcwd")


def test_periodic_module_allowlist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(periodic.ALLOWED_MODULES_ENV, "myjobs., tests")
    assert periodic.resolve(f"{FUNCS}:add") is not None  # a package allows its modules
    with pytest.raises(periodic.PeriodicError, match="ORCH_PERIODIC_MODULES may be called: myjobs, tests"):
        periodic.resolve("os:getcwd")
    # Refused before the import: a module outside the list never runs its top-level code
    with pytest.raises(periodic.PeriodicError, match="refused"):
        periodic.resolve("no_such_module_anywhere:f")
    # A name an allowed module only imported is not one of its functions
    with pytest.raises(periodic.PeriodicError, match="defined in module 'pathlib'"):
        periodic.resolve(f"{FUNCS}:Path")
    # Module boundaries, not string prefixes
    assert periodic.module_allowed("myjobs", ("myjobs",)) and periodic.module_allowed("myjobs.a.b", ("myjobs",))
    assert not periodic.module_allowed("myjobs_evil", ("myjobs",)) and not periodic.module_allowed("my", ("myjobs",))
    assert periodic.parse_modules(" a.b , c., a.b,") == ("a.b", "c")
    with pytest.raises(ValueError, match="not module names: 'a-b', 'x:y'"):
        periodic.parse_modules("ok, a-b, x:y")


@pytest.mark.parametrize(
    ("modules", "accepted", "refused"),
    [
        ("", [], [f"{FUNCS}:add", "os:getcwd"]),
        ("tests.periodic_funcs,myjobs", [f"{FUNCS}:add", "myjobs.daily:run"], ["os:system", "myjobsx:run", "tests:f"]),
    ],
)
def test_periodic_announces_its_allow_list_in_its_args_schema(
    monkeypatch: pytest.MonkeyPatch, modules: str, accepted: list[str], refused: list[str]
) -> None:
    monkeypatch.setenv(periodic.ALLOWED_MODULES_ENV, modules)
    kind = BUILTIN_KINDS["periodic"]
    schema = kind.announced_info().args_schema
    assert kind.info().args_schema["properties"]["function"]["pattern"] == periodic.FUNCTION_PATTERN  # untouched
    function = schema["properties"]["function"]
    assert "ORCH_PERIODIC_MODULES" in function["errorMessage"]
    validator = Draft202012Validator(schema)
    assert [f for f in accepted if not validator.is_valid({"function": f})] == []
    assert [f for f in refused if validator.is_valid({"function": f})] == []


async def test_http_poll_emits_first_and_changes_only(http_server: HttpServer) -> None:
    ctx = FakeContext()
    http_server.set(200, b"one")
    args = {"url": http_server.url, "interval_s": 0.05}
    assert await run_until("http_poll", args, ctx, lambda: http_server.requests >= 3) is None
    assert ctx.events == [
        {"status": 200, "sha256": hashlib.sha256(b"one").hexdigest(), "changed": ["status", "body"], "body": "one"}
        | {"truncated": False}
    ]


async def test_http_poll_raises_after_consecutive_errors() -> None:
    args = {"url": f"http://127.0.0.1:{free_port()}/", "interval_s": 0.05, "max_consecutive_errors": 3}
    error = await run_until("http_poll", args, FakeContext())
    assert isinstance(error, http_poll.HttpPollError) and "3 consecutive errors, last: ConnectError" in str(error)


async def test_http_poll_connects_only_where_the_egress_policy_allows(
    http_server: HttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(egress.DENY_ENV, "127.0.0.0/8, ::1")
    error = await run_until("http_poll", {"url": http_server.url, "interval_s": 0.05}, FakeContext())
    assert isinstance(error, EgressDenied), error  # at once: not one of the connection errors it tolerates
    assert "127.0.0.1 is in 127.0.0.0/8, denied by ORCH_EGRESS_DENY" in str(error)
    # A host name is judged by what it resolves to, when connecting
    by_name = http_server.url.replace("127.0.0.1", "localhost")
    error = await run_until("http_poll", {"url": by_name, "interval_s": 0.05}, FakeContext())
    assert isinstance(error, EgressDenied) and "localhost resolves to" in str(error), error
    assert http_server.requests == 0


async def test_http_poll_checks_every_redirect(http_server: HttpServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(egress.DENY_ENV, "127.0.0.2")
    http_server.set(302, b"", {"Location": "http://127.0.0.2:9/internal"})
    args = {"url": http_server.url, "interval_s": 0.05, "follow_redirects": True}
    error = await run_until("http_poll", args, FakeContext())
    assert isinstance(error, EgressDenied) and "127.0.0.2 is in 127.0.0.2/32" in str(error), error
    assert http_server.requests == 1  # the allowed first hop was asked, the denied one never


async def test_websocket_connects_only_where_the_egress_policy_allows(
    ws_server: WsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(egress.ALLOW_ENV, "10.0.0.0/8")
    error = await run_until("websocket", {"url": ws_server.url, "initial_backoff_s": 0.01}, FakeContext())
    assert isinstance(error, EgressDenied) and "127.0.0.1 is outside ORCH_EGRESS_ALLOW (10.0.0.0/8)" in str(error)
    assert ws_server.connections == 0


async def test_websocket_does_not_follow_a_handshake_redirect(ws_server: WsServer) -> None:
    """A redirect would lead past the egress check: a failed connection that says so."""
    ws_server.redirect_to = "ws://169.254.169.254/latest/meta-data/"
    args = {"url": ws_server.url, "initial_backoff_s": 0.01, "max_consecutive_failures": 2}
    error = await run_until("websocket", args, FakeContext())
    assert isinstance(error, websocket.WebSocketError), error
    assert "cannot follow redirect to ws://169.254.169.254/" in str(error) and "not followed" in str(error)
    assert ws_server.handshakes == 2 and ws_server.connections == 0


async def test_websocket_raises_after_consecutive_failed_connections() -> None:
    args = {"url": f"ws://127.0.0.1:{free_port()}/", "initial_backoff_s": 0.01, "max_consecutive_failures": 3}
    error = await run_until("websocket", args, FakeContext())
    assert isinstance(error, websocket.WebSocketError) and "3 consecutive failed connections" in str(error)


async def test_lease_loss_inside_a_call_is_never_counted_as_an_error(tmp_path: Path) -> None:
    ctx = FakeContext()
    checks = 0

    def lapses_after_the_kinds_own_check() -> None:
        nonlocal checks
        checks += 1
        if checks > 1:  # the kind checked before the call; the function's own check fails
            raise LeaseLost("gone")

    ctx.ensure_lease = lapses_after_the_kinds_own_check  # type: ignore[method-assign]
    args = {"function": f"{FUNCS}:record", "kwargs": {"path": str(tmp_path / "calls.log")}, "interval_s": 0.05}
    error = await run_until("periodic", args, ctx)
    assert isinstance(error, LeaseLost) and checks == 2 and ctx.events == []
    assert not (tmp_path / "calls.log").exists()


# --- end to end ------------------------------------------------------------------------


class Events:
    """A queue bound to ``observers.events`` before the observer exists; ``fetch`` drains it."""

    def __init__(self, system: System, pattern: str) -> None:
        self.system = system
        self.queue = unique("test.events")
        self.items: list[dict[str, Any]] = []

        async def bind(channel: aio_pika.abc.AbstractChannel) -> None:
            queue = await channel.declare_queue(self.queue, durable=True)
            await queue.bind(topology.EVENTS_EXCHANGE, routing_key=pattern)

        system.amqp(bind)

    def fetch(self) -> list[dict[str, Any]]:
        async def drain(channel: aio_pika.abc.AbstractChannel) -> list[dict[str, Any]]:
            queue = await channel.declare_queue(self.queue, passive=True)
            bodies = []
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                bodies.append(json.loads(message.body))
            return bodies

        self.items += self.system.amqp(drain)
        return self.items

    def payloads(self) -> list[dict[str, Any]]:
        return [event["payload"] for event in self.fetch()]

    def wait(self, count: int, what: str, timeout: float = 60) -> list[dict[str, Any]]:
        wait_for(lambda: len(self.fetch()) >= count, timeout, what, every=0.3)
        return [event["payload"] for event in self.items]


def start(system: System, pattern: str, services: tuple[str, ...] = ("svc-a",)) -> Events:
    system.start_manager()
    for name in services:
        system.start_service(name, workers=5, ORCH_PERIODIC_MODULES=FUNCS)
    return Events(system, pattern)


def test_http_poll_emits_on_first_response_and_on_changes_only(system: System, http_server: HttpServer) -> None:
    events = start(system, "http_poll.#")
    http_server.set(200, b"price=100 and more")
    created = system.create(
        "poller", kind="http_poll", args={"url": http_server.url, "interval_s": 0.3} | {"max_body_bytes": 9}
    )
    system.wait_status(created["id"], "Processing")

    first = events.wait(1, "the first response")[0]
    assert first == {
        "status": 200,
        "sha256": hashlib.sha256(b"price=100 and more").hexdigest(),
        "changed": ["status", "body"],
        "body": "price=100",
        "truncated": True,
    }
    assert events.items[0]["name"] == "poller" and events.items[0]["observer_id"] == created["id"]
    # Unchanged answers: polled again and again, nothing emitted
    seen = http_server.requests
    wait_for(lambda: http_server.requests >= seen + 3, 30, "three more polls")
    assert len(events.payloads()) == 1

    http_server.set(200, b"price=101")
    assert events.wait(2, "the body change")[1]["changed"] == ["body"]
    http_server.set(503, b"price=101")
    third = events.wait(3, "the status change")[2]
    assert third["changed"] == ["status"] and third["status"] == 503 and third["body"] == "price=101"

    seen = http_server.requests
    wait_for(lambda: http_server.requests >= seen + 3, 30, "three more polls")
    assert len(events.payloads()) == 3


def test_http_poll_on_a_dead_url_fails_after_consecutive_errors(system: System) -> None:
    start(system, "http_poll.#")
    args = {"url": f"http://127.0.0.1:{free_port()}/", "interval_s": 0.2, "max_consecutive_errors": 3}
    created = system.create("dead-url", kind="http_poll", args=args, retry=NO_RETRY)
    failed = system.wait_status(created["id"], "Failed", timeout=120)
    assert "3 consecutive errors" in failed["last_error"], failed


def test_websocket_subscribes_emits_and_resubscribes_after_a_drop(system: System, ws_server: WsServer) -> None:
    events = start(system, "websocket.#")
    subscribe = {"op": "subscribe", "args": ["BTC-USD"]}
    args = {"url": ws_server.url, "subscribe": subscribe, "initial_backoff_s": 0.2, "max_backoff_s": 1}
    created = system.create("btc-feed", kind="websocket", args=args)
    system.wait_status(created["id"], "Processing")

    wait_for(lambda: ws_server.subscribed() == 1, 30, "the subscription")
    assert json.loads(ws_server.subscriptions[0]) == subscribe
    ws_server.send('{"price": 100.5}')
    ws_server.send("not json")
    assert events.wait(2, "two messages") == [{"message": {"price": 100.5}}, {"message": "not json"}]

    ws_server.drop()
    wait_for(lambda: ws_server.connections == 2 and ws_server.subscribed() == 1, 30, "a reconnection")
    assert [json.loads(s) for s in ws_server.subscriptions] == [subscribe, subscribe]
    ws_server.send('{"price": 101}')
    assert events.wait(3, "the message after the reconnection")[2] == {"message": {"price": 101}}
    assert system.observer(created["id"])["status"] == "Processing"


def read_calls(path: Path) -> list[tuple[str, float, float]]:
    """(service id, start, end) of each call ``tests.periodic_funcs:record`` finished."""
    if not path.exists():
        return []
    return [(s, float(a), float(b)) for s, a, b in (line.split() for line in path.read_text().splitlines())]


def test_periodic_runs_once_cluster_wide_and_moves_on_kill_9(system: System, tmp_path: Path) -> None:
    system.start_manager()
    procs = {name: system.start_service(name, workers=5, ORCH_PERIODIC_MODULES=FUNCS) for name in ("svc-a", "svc-b")}
    log = tmp_path / "calls.log"
    args = {"function": f"{FUNCS}:record", "kwargs": {"path": str(log), "sleep_s": 0.3}, "interval_s": 0.5}
    created = system.create("singleton", kind="periodic", args=args)
    first = system.wait_status(created["id"], "Processing")
    survivor = next(name for name in procs if name != first["service_name"])
    wait_for(lambda: len(read_calls(log)) >= 3, 30, "three calls on the first service")

    killed_at = time.time()
    procs[first["service_name"]].kill9()

    moved = wait_for(
        lambda: (o := system.observer(created["id"]))["service_name"] == survivor and o["status"] == "Processing" and o,
        60,
        "the observer to move to the survivor",
    )
    wait_for(lambda: sum(c[0] == moved["service_id"] for c in read_calls(log)) >= 3, 60, "calls on the survivor")

    calls = sorted(read_calls(log), key=lambda c: c[1])
    callers = [c[0] for c in calls]
    # One service, then the other: never both in the same period
    assert callers == [first["service_id"]] * callers.count(first["service_id"]) + [
        moved["service_id"]
    ] * callers.count(moved["service_id"]), callers
    assert all(c[2] <= killed_at for c in calls if c[0] == first["service_id"])
    assert all(c[1] >= killed_at for c in calls if c[0] == moved["service_id"])
    # And no two calls ever overlap in time
    assert all(end <= next_start for (_, _, end), (_, next_start, _) in itertools.pairwise(calls)), calls


def test_periodic_call_over_its_timeout_is_cancelled_and_counts_as_an_error(system: System, tmp_path: Path) -> None:
    events = start(system, "periodic.#")
    log = tmp_path / "sleepy.log"
    args = {
        "function": f"{FUNCS}:sleepy",
        "kwargs": {"path": str(log), "sleep_s": 60},
        "interval_s": 0.2,
        "timeout_s": 0.5,
        "max_consecutive_errors": 2,
    }
    created = system.create("too-slow", kind="periodic", args=args, retry=NO_RETRY)

    first = events.wait(1, "the first call's error")[0]
    assert first["call"] == 1 and "timed out after 0.5s" in first["error"]
    failed = system.wait_status(created["id"], "Failed", timeout=120)
    assert "2 consecutive errors" in failed["last_error"] and "timed out" in failed["last_error"], failed
    lines = log.read_text().split()
    assert "finished" not in lines and lines[:4] == ["start", "cancelled", "start", "cancelled"]


def test_periodic_functions_outside_the_services_allow_list_are_refused_at_create(
    system: System, tmp_path: Path
) -> None:
    system.start_manager()
    system.start_service("svc-unset", workers=5)  # ORCH_PERIODIC_MODULES unset: calls nothing
    system.start_service("svc-jobs", workers=5, ORCH_POOLS="jobs", ORCH_PERIODIC_MODULES=FUNCS)
    add = {"function": f"{FUNCS}:add", "kwargs": {"a": 1, "b": 2}}

    # Unset: every function is refused before anything is queued, and the answer says what to set
    refused = system.post("/api/observers", {"name": "p-unset", "kind": "periodic", "args": add})
    assert refused.status_code == 422, refused.text
    assert "function: this service calls no function: ORCH_PERIODIC_MODULES is unset" in refused.json()["detail"]

    # Set: outside the listed modules is refused, naming the variable and what it allows
    for outside in ("os:getcwd", "tests.local_servers:HttpServer", "tests:periodic_funcs"):
        body = {"name": "p-out", "kind": "periodic", "args": {"function": outside}, "pool": "jobs"}
        refused = system.post("/api/observers", body)
        assert refused.status_code == 422, refused.text
        assert (
            f"only functions defined in the modules of ORCH_PERIODIC_MODULES may be called: {FUNCS} "
            f"(got '{outside}')" in refused.json()["detail"]
        )
    assert system.observers() == []

    # Inside: created, and it runs
    events = Events(system, "periodic.#")
    created = system.create("p-in", kind="periodic", args=add | {"interval_s": 0.2}, pool="jobs")
    system.wait_status(created["id"], "Processing")
    assert events.wait(1, "a call")[0]["result"] == 3
    listed = {k["name"]: k for k in system.get("/api/kinds").json()}["periodic"]
    assert "allowed here" in listed["args_schema"]["properties"]["function"]["description"]


def test_a_service_refuses_a_periodic_start_that_bypassed_the_manager(system: System) -> None:
    """Defense in depth: a start message published straight to the broker (not through the
    API) for a function the service does not allow is never called: it fails at once."""
    system.start_manager()
    system.start_service("svc-a", workers=5)  # ORCH_PERIODIC_MODULES unset
    start = StartObserver(
        observer_id=uuid.uuid4(),
        name="smuggled",
        kind="periodic",
        args={"function": "os:getcwd"},
        retry=RetryPolicy(max_attempts=1),
    )
    system.publish_raw(topology.start_queue_name("default"), start.encode())
    error_queue = topology.error_queue_name(topology.start_queue_name("default"))
    wait_for(lambda: system.queue_counts(error_queue)[0] == 1, 30, "the start to be dead-lettered")
    assert "os:getcwd refused: this service calls no function: ORCH_PERIODIC_MODULES is unset" in system.logs()


def test_a_service_never_connects_where_its_operator_denied(
    system: System, http_server: HttpServer, ws_server: WsServer
) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=5, ORCH_EGRESS_DENY="127.0.0.0/8,::1")
    poll = system.create("to-loopback", kind="http_poll", args={"url": http_server.url}, retry=NO_RETRY)
    feed = system.create("ws-loopback", kind="websocket", args={"url": ws_server.url}, retry=NO_RETRY)
    for created in (poll, feed):
        failed = system.wait_status(created["id"], "Failed", timeout=60)
        assert "127.0.0.1 is in 127.0.0.0/8, denied by ORCH_EGRESS_DENY" in failed["last_error"], failed
    assert http_server.requests == 0 and ws_server.connections == 0
