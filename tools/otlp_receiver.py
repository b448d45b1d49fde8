"""A tiny OTLP/HTTP trace receiver for tests and benchmarks: ``POST /v1/traces`` on
127.0.0.1, protobuf bodies decoded with opentelemetry-proto (the exporter's own dependency,
installed by the ``otel`` extra) into plain ``Span`` records. Not a collector: it keeps what
it got in memory and answers 200 to every export.

    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, ...}
        ...
        receiver.spans  # every span exported so far
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Span:
    service: str  # the resource's service.name
    name: str
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind
    attributes: dict[str, Any] = field(default_factory=dict)
    links: tuple[tuple[str, str], ...] = ()  # (trace id, span id) of each link


class OtlpReceiver:
    """Serves on a free port of 127.0.0.1 from a daemon thread, between ``start`` and ``stop``."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep  # False: count spans only (a benchmark's tens of thousands)
        self.spans: list[Span] = []
        self.count = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces"
                if ok:
                    receiver._received(body)
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                """Not a line per export."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def endpoint(self) -> str:
        """For ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter appends ``/v1/traces``)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    def _received(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans: list[Span] = []
        count = 0
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            service = str(resource.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                count += len(scope_spans.spans)
                if self.keep:
                    spans += [_span(service, s) for s in scope_spans.spans]
        with self._lock:
            self.count += count
            self.spans += spans


def _span(service: str, s: Any) -> Span:
    return Span(
        service=service,
        name=s.name,
        trace_id=s.trace_id.hex(),
        span_id=s.span_id.hex(),
        parent_span_id=s.parent_span_id.hex(),
        kind=s.kind,
        attributes=_attributes(s.attributes),
        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
    )


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: Any) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, which)
