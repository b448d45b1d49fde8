"""``shared.tracing``: off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (nothing of
OpenTelemetry imported, no header added), and on, the context chain of one start: publish →
start observer → the report's headers → the leader's linked span."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from shared import tracing

# The service's side: nothing of OpenTelemetry at all.
_SERVICE_OFF = textwrap.dedent(
    """
    import asyncio, sys, time, uuid

    from shared import tracing
    assert not tracing.enabled() and not tracing.setup("orchestrator-service")

    import observer_service.__main__
    from observer_service.lease import Lease
    from observer_service.outbox import Outbox, pack
    from observer_service.runner import Runner
    from observer_service.session import _trace_headers, _traces
    from shared.kinds import discover_kinds
    from shared.messages import StartObserver
    from observer_service.settings import ServiceSettings
    from tests.unit.fakes import FakeSession, deliver, inbox_for, until

    async def service() -> None:
        lease = Lease(heartbeat_s=10)
        lease.renew(time.monotonic())
        session = FakeSession(lease)
        outbox = Outbox()
        runner = Runner(ServiceSettings(), uuid.uuid4(), outbox, {"idle": discover_kinds()["idle"]})
        start = StartObserver(observer_id=uuid.uuid4(), name="o", kind="idle")
        traced = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        deliver(inbox_for(runner), start.model_dump_json().encode(), 1, session, traced)
        await until(lambda: len(outbox) == 1)
        batch = await outbox.peek_batch(10)
        assert batch[0].trace is None, batch
        assert [_trace_headers(m, _traces(batch)) for m in pack(batch)] == [None]
        session.closed.set()
        for running in list(runner.running.values()):
            running.task.cancel()
        await asyncio.sleep(0.05)

    asyncio.run(service())
    loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
    assert not loaded, loaded
    print("ok")
    """
)

# The manager's side. FastAPI (0.12x and later) imports opentelemetry's API itself, for a
# telemetry of its own that stays off while no provider is set: what it imports is the
# baseline, and nothing may come on top of it (the SDK, the exporter, the instrumentations).
_MANAGER_OFF = textwrap.dedent(
    """
    import sys, uuid

    import fastapi
    baseline = {name for name in sys.modules if name.startswith("opentelemetry")}

    from shared import tracing
    assert not tracing.enabled() and not tracing.setup("orchestrator-manager")

    import manager.__main__, manager.state_side
    from manager.app import create_app
    from manager.broker import _publish_attributes
    from shared import topology
    from shared.messages import StartObserver
    from manager.settings import get_manager_settings

    app = create_app(get_manager_settings())
    assert not any("opentelemetry" in type(m.cls).__module__ for m in app.user_middleware)
    start = StartObserver(observer_id=uuid.uuid4(), name="o", kind="idle")
    with tracing.producer_span("publish starts", _publish_attributes([start], "orch.start.default")) as headers:
        assert headers is None
        assert topology.persistent_properties(str(start.message_id), headers).headers is None
    traced = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    with tracing.linked_span("apply reports", [traced], {}):
        pass
    loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry") and name not in baseline)
    assert not loaded, loaded
    print("ok")
    """
)


@pytest.mark.parametrize("script", [_SERVICE_OFF, _MANAGER_OFF], ids=["service", "manager"])
def test_off_imports_nothing_of_opentelemetry_and_adds_no_header(script: str) -> None:
    """With the variable unset, the service's and the manager's paths (their entry modules,
    the app, a publish's span, a start admitted with a traceparent, its report packed, a
    batch's span) run without importing any ``opentelemetry`` module of ours, and no message
    gets a header. In a subprocess: this test process may have imported it already."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.fixture
def spans() -> Iterator[Any]:
    """Traces on in this process, exported to memory (``setup`` would export over HTTP)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = tracing._provider, tracing._tracer, tracing._propagator
    tracing._provider, tracing._tracer = provider, provider.get_tracer("test")
    tracing._propagator = TraceContextTextMapPropagator()
    try:
        yield exporter
    finally:
        tracing._provider, tracing._tracer, tracing._propagator = saved


def test_one_start_is_one_chain(spans: Any) -> None:
    """publish → start observer (a child of the context the start's headers carry) → the
    report's headers → the leader's span, linked to it; a packed report links to each start."""
    with tracing.producer_span("publish starts", {"messaging.batch.message_count": 2}) as headers:
        assert headers is not None and headers["traceparent"].startswith("00-")
    carriers = []
    for oid in (uuid.uuid4(), uuid.uuid4()):
        with tracing.consumer_span("start observer", headers, {"orch.observer.id": str(oid)}) as carrier:
            assert carrier is not None
            carriers.append(carrier)
    one = tracing.report_headers(carriers[:1])
    both = tracing.report_headers(carriers)
    assert one is not None and one["traceparent"] == carriers[0]["traceparent"]
    assert both is not None and "traceparent" not in both and len(both[tracing.LINKS_HEADER]) == 2
    with tracing.linked_span("apply reports", [None, {}, {"traceparent": b"not one"}], {}):
        pass  # nothing to link: no span
    with tracing.linked_span("apply reports", [both, {"other": 1}], {"orch.reports": 2}):
        pass

    finished: dict[str, list[Any]] = {}
    for span in spans.get_finished_spans():
        finished.setdefault(span.name, []).append(span)
    (publish,) = finished["publish starts"]
    starts = finished["start observer"]
    (apply,) = finished["apply reports"]
    assert publish.context is not None and apply.context is not None
    for start in starts:
        assert start.parent is not None and start.parent.span_id == publish.context.span_id
        assert start.context is not None and start.context.trace_id == publish.context.trace_id
    assert apply.parent is not None and apply.parent.span_id == starts[0].context.span_id
    assert apply.context.trace_id == publish.context.trace_id
    linked = {link.context.span_id for link in apply.links}
    assert linked == {s.context.span_id for s in starts if s.context is not None}


def test_a_failure_marks_the_span_by_its_type_alone(spans: Any) -> None:
    """An exception's message may quote what a span must not hold: only its type is kept."""
    with pytest.raises(ValueError), tracing.producer_span("publish starts", {}):
        raise ValueError("amqp://orch:password@host")
    (span,) = spans.get_finished_spans()
    assert span.status.description == "ValueError" and not span.events


async def test_a_create_group_publishes_in_its_first_request_s_context(spans: Any) -> None:
    """The groups' runner task is begun by one request and outlives it: each group's publish
    must be the child of a request of that group, not of the request that began the runner."""
    from manager.create_groups import CreateGroups

    async def create_many(specs: list[Any]) -> list[Any]:
        with tracing.producer_span("publish starts", {"messaging.batch.message_count": len(specs)}):
            await asyncio.sleep(0.01)
        return list(specs)

    groups = CreateGroups(create_many)

    async def request(name: str) -> None:
        with tracing._span(name, "SERVER", {}):
            await groups.create(name)  # type: ignore[arg-type]

    first = asyncio.create_task(request("request a"))
    await asyncio.sleep(0)  # a's group begins
    await asyncio.gather(first, request("request b"))

    by_name = {s.name: s for s in spans.get_finished_spans() if s.name.startswith("request")}
    publishes = [s for s in spans.get_finished_spans() if s.name == "publish starts"]
    assert len(publishes) == 2
    parents = {s.parent.span_id for s in publishes}
    assert parents == {by_name["request a"].context.span_id, by_name["request b"].context.span_id}


def test_an_unsampled_trace_adds_no_header_and_makes_no_span_downstream(spans: Any) -> None:
    """A request sampled out: its publish puts no header on the starts; a start without a
    sampled context (none, or flags 00) makes no span and its report carries nothing."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    saved = tracing._tracer
    tracing._tracer = TracerProvider(sampler=ALWAYS_OFF).get_tracer("test")
    try:
        with tracing.producer_span("publish starts", {}) as headers:
            assert headers is None
    finally:
        tracing._tracer = saved
    unsampled = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-00"}
    for carried in (None, {}, {"other": "x"}, unsampled, {"traceparent": "nonsense"}):
        with tracing.consumer_span("start observer", carried, {}) as carrier:
            assert carrier is None
    assert tracing.report_headers([]) is None
    assert not spans.get_finished_spans()


_NOT_INSTALLED = textwrap.dedent(
    """
    import sys

    class NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name.startswith("opentelemetry.sdk"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    from shared import tracing
    assert tracing.enabled() and not tracing.setup("orchestrator-service") and not tracing.active()
    print("ok")
    """
)


def test_without_the_extra_the_variable_says_so_and_runs_untraced() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    done = subprocess.run([sys.executable, "-c", _NOT_INSTALLED], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert "pip install '.[otel]'" in done.stderr
