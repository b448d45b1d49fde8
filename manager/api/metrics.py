"""/metrics (Prometheus text format), and the API latency it reports."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from manager import metrics
from manager.api.deps import SessionDep

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def get_metrics(request: Request, session: SessionDep) -> Response:
    backlog = await request.app.state.broker.state_backlog()
    return Response(await metrics.render(session, backlog), media_type=CONTENT_TYPE_LATEST)


async def measure_latency(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Middleware: latency per route *template* (``/api/observers/{observer_id}``), so ids do
    not explode the number of series."""
    started = time.perf_counter()
    response = await call_next(request)
    route = getattr(request.scope.get("route"), "path", "unmatched")  # set by the router
    metrics.API_LATENCY.labels(request.method, route, str(response.status_code)).observe(time.perf_counter() - started)
    return response
