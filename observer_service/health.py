"""What a service answers on ``ORCH_METRICS_PORT``, from a thread of its own: ``/metrics``,
``/healthz`` and ``/readyz`` (the probes of ``deploy/kubernetes/``).

* ``/healthz``: the event loop ran within ``ORCH_HEALTH_STALL_S``. It reads when the loop last
  ran (the watchdog's tick), so a loop blocked by an observer fails it while the broker
  connection's own thread keeps the session alive; a restart then moves the observers.
* ``/readyz``: a broker session is open and consuming; 503 with why not (no session, what the
  broker refuses), 200 "degraded" while a pool's start queue alone is refused. A stopped broker
  fails this one only: restarting the service would not bring the broker back.
* ``/metrics``: the service's Prometheus metrics, as before.

A probe answered from the loop itself would prove nothing when the loop is blocked, and
``prometheus_client``'s own server answered 200 on every path, so a probe on it proved
nothing either.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from observer_service.metrics import REGISTRY

logger = logging.getLogger(__name__)

PATHS = ("/metrics", "/healthz", "/readyz")


@dataclass
class Probes:
    last_tick: Callable[[], float]  # monotonic instant the event loop last ran
    readiness: Callable[[], tuple[bool, dict[str, Any]]]  # (ready, what /readyz says)
    stall_s: float


def serve(host: str, port: int, probes: Probes) -> ThreadingHTTPServer:
    """Serve the three paths on a daemon thread; raises ``OSError`` if the port cannot be bound."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                stalled = max(0.0, time.monotonic() - probes.last_tick())
                ok = stalled < probes.stall_s
                body = {"status": "ok" if ok else "event loop stalled", "loop_stalled_s": round(stalled, 3)}
                self._json(200 if ok else 503, body)
            elif path == "/readyz":
                ready, body = probes.readiness()
                self._json(200 if ready else 503, body)
            else:
                self._json(404, {"detail": f"no {path} here: {', '.join(PATHS)}"})

        def _json(self, status: int, body: dict[str, Any]) -> None:
            self._send(status, json.dumps(body).encode(), "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Not a line per probe."""

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
