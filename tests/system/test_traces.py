"""Traces (issue 63, item 3; ``shared/tracing.py``): a real manager and a real service export
to an OTLP/HTTP receiver inside the test (``tools/otlp_receiver.py``), and one create shows
the whole chain in one trace: the API's request → ``publish starts`` → the service's
``start observer`` (a child of the publish, through the start message's AMQP headers), and
the leader's ``apply reports`` linked to that span. No attribute holds the observer's args,
the API token or a password. With the variable unset, a start carries no ``traceparent``."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import aio_pika
import pytest

from shared import topology
from tools.harness import System, wait_for
from tools.otlp_receiver import OtlpReceiver, Span

TOKEN = "traces-token-" + uuid.uuid4().hex


def _values(value: object) -> list[str]:
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in (str(key), *_values(item))]
    if isinstance(value, list):
        return [text for item in value for text in _values(item)]
    return [str(value)]


def test_one_create_is_one_trace(system: System, tmp_path: Path) -> None:
    receiver = OtlpReceiver().start()
    try:
        system.env |= {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        }
        system.token = TOKEN
        system.start_manager(ORCH_API_TOKENS=TOKEN)
        system.start_service("svc-traced", workers=5, ORCH_PERIODIC_MODULES="tests.periodic_funcs")
        marker = "args-marker-" + uuid.uuid4().hex
        args = {"function": "tests.periodic_funcs:record", "kwargs": {"path": str(tmp_path / marker)}}
        created = system.create("traced", kind="periodic", args=args | {"interval_s": 3600})
        oid = created["id"]
        system.wait_status(oid, "Processing")

        def chain() -> tuple[Span, Span, Span, Span] | None:
            spans = receiver.snapshot()
            starts = [s for s in spans if s.name == "start observer" and s.attributes.get("orch.observer.id") == oid]
            if not starts:
                return None
            start = starts[0]
            by_id = {s.span_id: s for s in spans}
            publish = by_id.get(start.parent_span_id)
            request = by_id.get(publish.parent_span_id) if publish is not None else None
            applies = [s for s in spans if s.name == "apply reports" and (start.trace_id, start.span_id) in s.links]
            if publish is None or request is None or not applies:
                return None
            return request, publish, start, applies[0]

        found = wait_for(chain, 30, "the create's spans, from the request to the apply")
        assert found is not None
        request, publish, start, apply = found
        spans = receiver.snapshot()
    finally:
        receiver.stop()

    assert request.service == publish.service == apply.service == "orchestrator-manager"
    assert start.service == "orchestrator-service"
    assert request.parent_span_id == "" and "POST" in request.name, request
    assert publish.name == "publish starts" and publish.attributes["messaging.destination.name"] == "orch.start.default"
    assert publish.attributes["messaging.batch.message_count"] == 1
    assert request.trace_id == publish.trace_id == start.trace_id
    assert start.attributes == {
        "orch.observer.id": oid,
        "orch.observer.kind": "periodic",
        "orch.service.name": "svc-traced",
        "orch.service.id": start.attributes["orch.service.id"],
    }
    assert apply.attributes["orch.links"] >= 1
    assert len([s for s in spans if s.parent_span_id == "" and s.trace_id == request.trace_id]) == 1, (
        "FastAPI's own telemetry made a second request span"
    )
    assert any(s.name.startswith(("INSERT", "SELECT", "UPDATE")) for s in spans), "no asyncpg span"

    secrets = {marker, TOKEN}
    for url in (system.amqp_url, system.database_url):
        password = urlsplit(url).password
        assert password
        secrets.add(password)
    for span in spans:
        for text in [span.name, *_values(span.attributes)]:
            leaked = [secret for secret in secrets if secret in text]
            assert not leaked, f"span {span.name!r} holds a secret: {text!r}"


def test_no_traceparent_on_a_start_without_the_variable(system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset, no header at all. The start is taken by the test itself: a consumer above every
    service's priority gets it first, reads its headers, and gives it back as it closes."""
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    system.start_manager()
    system.start_service("svc-untraced", workers=5)

    async def first_start(channel: aio_pika.abc.AbstractChannel) -> dict[str, object]:
        queue = await channel.get_queue(topology.start_queue_name("default"), ensure=False)
        got: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        await queue.consume(got.put, arguments={"x-priority": 100})
        await asyncio.to_thread(system.create, "untraced", kind="idle")
        message = await asyncio.wait_for(got.get(), 15)
        return dict(message.headers)

    headers = system.amqp(first_start)
    assert headers == {}, headers
