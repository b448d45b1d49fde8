"""Traces (OpenTelemetry, ``pip install '.[otel]'``): on only when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set. This module is the only one that imports
opentelemetry, and only from ``setup`` once it found that variable set: unset, nothing of
OpenTelemetry is imported here, every helper is a no-op and no message gets a header
(``tests/unit/test_tracing.py``; FastAPI imports OpenTelemetry's API on its own).

The chain of one start (docs/operations.md, "Traces"): the API's request span (FastAPI's
instrumentation) → ``publish starts``, one per batch of starts, whose W3C ``traceparent``
every start message of the batch carries in its AMQP headers (starts are published on
aiormq directly, ``shared/batch_publish.py``, where aio-pika's instrumentation never
looks) → the service's ``start observer``, a child of the context its delivery carried →
the leader's ``apply reports``, one span per applied batch with a link to each start report's
``start observer`` (a packed report carries them all in ``x-orch-traceparents``), a child of
the first. A trace sampled out at its root carries no header downstream and makes no span.

The SDK is configured from the standard variables: ``OTEL_SERVICE_NAME`` (default: the
name given to ``setup``), ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG``,
``OTEL_BSP_*``, ``OTEL_EXPORTER_OTLP_*`` (the exporter is OTLP over HTTP, protobuf).
Attributes are ids, kinds, names of queues and services, and counts: never an observer's
args, a token or a password, and no span records an exception's message.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Link, Span, SpanKind, Tracer
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger(__name__)

ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# A report that packs many starts (``ObserversStarted``) links to each one's span.
LINKS_HEADER = "x-orch-traceparents"

Carrier = dict[str, str]
Attributes = Mapping[str, str | int | bool]

_provider: TracerProvider | None = None
_tracer: Tracer | None = None
_propagator: TraceContextTextMapPropagator | None = None


def enabled() -> bool:
    """Whether traces are asked for: ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set."""
    return bool(os.environ.get(ENDPOINT_VARIABLE, "").strip())


def active() -> bool:
    """Whether ``setup`` configured the SDK in this process."""
    return _tracer is not None


def setup(default_service_name: str) -> bool:
    """Configure the SDK (once per process) if ``enabled()``; whether traces are on."""
    global _provider, _tracer, _propagator
    if _tracer is not None or not enabled():
        return _tracer is not None
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError as e:  # traces are no reason to refuse to run
        logger.error("%s is set but %s: no traces (pip install '.[otel]')", ENDPOINT_VARIABLE, e)
        return False

    name = os.environ.get("OTEL_SERVICE_NAME") or default_service_name
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))  # sampler: OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _provider, _propagator = provider, TraceContextTextMapPropagator()
    _tracer = provider.get_tracer("orchestrator")
    return True


def shutdown() -> None:
    """End tracing: export what the batch processor still holds (the SIGTERM path calls it)."""
    global _provider, _tracer
    if _provider is not None:
        _provider.shutdown()
    _provider = _tracer = None


def instrument_app(app: Any) -> None:
    """FastAPI's instrumentation on ``app`` (a request span per API call), when on. Not the
    health and metrics probes; no span per ASGI send and receive."""
    if _provider is None:
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=_provider,
        excluded_urls="/healthz,/readyz,/metrics,/static/",
        exclude_spans=["receive", "send"],
    )


def instrument_asyncpg() -> None:
    """asyncpg's instrumentation (a span per statement; its parameters are never recorded)."""
    if _provider is None:
        return
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

    AsyncPGInstrumentor(capture_parameters=False).instrument(tracer_provider=_provider)  # type: ignore[no-untyped-call]


def _kind(name: str) -> SpanKind:
    from opentelemetry.trace import SpanKind

    return SpanKind[name]


def _carrier(span: Span) -> Carrier:
    from opentelemetry import trace

    assert _propagator is not None
    carrier: Carrier = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


@contextlib.contextmanager
def _span(name: str, kind: str, attributes: Attributes, current: bool = True, **options: Any) -> Iterator[Span]:
    """A span, ended on the way out, and made current for the block unless ``current`` is
    False; an exception marks it failed by its type alone (its message may quote what a span
    must not hold)."""
    from opentelemetry.trace import Status, StatusCode

    assert _tracer is not None
    span = _tracer.start_span(name, kind=_kind(kind), attributes=dict(attributes), record_exception=False, **options)
    try:
        if current:
            from opentelemetry.trace import use_span

            with use_span(span, record_exception=False, set_status_on_exception=False):
                yield span
        else:
            yield span
    except BaseException as e:
        span.set_status(Status(StatusCode.ERROR, type(e).__name__))
        raise
    finally:
        span.end()


@contextlib.contextmanager
def producer_span(name: str, attributes: Attributes) -> Iterator[Carrier | None]:
    """A span around a publish, child of the current one; yields the headers every message of
    the publish carries: None when traces are off or the span is not sampled (the trace was
    decided against at its root: its starts carry nothing and make no span downstream)."""
    if _tracer is None:
        yield None
        return
    with _span(name, "PRODUCER", attributes) as span:
        yield _carrier(span) if span.get_span_context().trace_flags.sampled else None


@contextlib.contextmanager
def consumer_span(name: str, headers: Mapping[str, Any] | None, attributes: Attributes) -> Iterator[Carrier | None]:
    """A span child of the sampled context ``headers`` carry, whose own context it yields as
    headers for the report it leads to. None, and no span at all, when traces are off or
    ``headers`` carry no sampled context: the decision made at the trace's root (the request,
    the scheduler's or a repair's publish) is followed here whatever this process's sampler,
    and a start sampled out costs no more than a look at its headers (at a 0.1 ratio, nine
    starts in ten: an unsampled span for each of them was most of the service's tracing
    cost, figures: docs/operations.md, "Traces")."""
    if _tracer is None or not headers or TRACEPARENT not in headers:
        yield None
        return
    from opentelemetry import trace

    assert _propagator is not None
    parent = _propagator.extract(_text_headers(headers))
    if not trace.get_current_span(parent).get_span_context().trace_flags.sampled:
        yield None
        return
    # Not made current: the observer's task, created in the block, would keep the span's
    # context (and the span) for as long as it runs.
    with _span(name, "CONSUMER", attributes, current=False, context=parent) as span:
        yield _carrier(span) if span.get_span_context().trace_flags.sampled else None


@contextlib.contextmanager
def linked_span(name: str, headers: Iterable[Mapping[str, Any] | None], attributes: Attributes) -> Iterator[None]:
    """A span linked to the sampled context each of ``headers`` carries, and a child of the
    first: in a trace that was sampled, so recorded whatever the ratio (as a root it would be
    sampled again, at the ratio, and nine batches in ten would be lost at 0.1). None at all if
    none of them carries one (or traces are off)."""
    links = _links(headers) if _tracer is not None else []
    if not links:
        yield
        return
    from opentelemetry import trace

    parent = trace.set_span_in_context(trace.NonRecordingSpan(links[0].context))
    with _span(name, "INTERNAL", {**attributes, "orch.links": len(links)}, context=parent, links=links):
        yield


def report_headers(carriers: list[Carrier]) -> dict[str, Any] | None:
    """The headers of a report about the spans of ``carriers``: each one's ``traceparent`` in
    ``LINKS_HEADER``, and, for a report about one, its ``traceparent``/``tracestate`` too."""
    if not carriers:
        return None
    headers: dict[str, Any] = {LINKS_HEADER: [c[TRACEPARENT] for c in carriers if TRACEPARENT in c]}
    if len(carriers) == 1:
        headers.update(carriers[0])
    return headers


def _links(all_headers: Iterable[Mapping[str, Any] | None]) -> list[Link]:
    from opentelemetry import trace
    from opentelemetry.trace import Link

    assert _propagator is not None
    links = []
    for headers in all_headers:
        if not headers:
            continue
        listed = headers.get(LINKS_HEADER)
        parents = listed if isinstance(listed, list | tuple) else [headers.get(TRACEPARENT)]
        for parent in parents:
            text = _text(parent)
            if text is None:
                continue
            context = trace.get_current_span(_propagator.extract({TRACEPARENT: text})).get_span_context()
            if context.is_valid and context.trace_flags.sampled:
                links.append(Link(context))
    return links


def _text_headers(headers: Mapping[str, Any] | None) -> Carrier:
    """``traceparent`` and ``tracestate`` of AMQP headers, as text (pamqp may give bytes)."""
    carrier: Carrier = {}
    for key in (TRACEPARENT, TRACESTATE):
        text = _text(headers.get(key)) if headers else None
        if text is not None:
            carrier[key] = text
    return carrier


def _text(value: object) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("ascii", "replace")
    return value if isinstance(value, str) else None
