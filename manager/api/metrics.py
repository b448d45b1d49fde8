"""/metrics (Prometheus text format), and the API latency it reports."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from manager import metrics
from manager.api.deps import SessionDep

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def get_metrics(request: Request, session: SessionDep) -> Response:
    backlog = await request.app.state.broker.state_backlog()
    text = await metrics.render(session, backlog) + (await request.app.state.state_metrics()).encode()
    return Response(text, media_type=CONTENT_TYPE_LATEST)


class LatencyMetrics:
    """ASGI middleware: latency per route *template* (``/api/observers/{observer_id}``), so
    ids do not explode the number of series. Plain ASGI rather than ``@app.middleware``:
    Starlette's ``BaseHTTPMiddleware`` adds a task and a stream to every request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers if the app raises before starting a response

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")  # set by the router
            metrics.API_LATENCY.labels(scope["method"], route, str(status)).observe(time.perf_counter() - started)
