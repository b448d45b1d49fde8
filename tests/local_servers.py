"""Servers on 127.0.0.1 for the built-in kinds' tests: an HTTP server whose answer the test
sets, and a WebSocket server that records subscriptions and sends what the test says. Each
runs in a background thread; ``close()`` stops it (fixtures call it in teardown)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response

T = TypeVar("T")


class HttpServer:
    """Answers every GET with ``status``, ``body`` and extra ``headers`` (change them at any time)."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b""
        self.headers: dict[str, str] = {}
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests += 1
                status, body = owner.status, owner.body
                self.send_response(status)
                for name, value in owner.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/status"

    def set(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers or {}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


class WsServer:
    """Records the first message of each connection (the subscription); ``send`` goes to
    every open connection, ``drop`` closes them all (code 1012, "service restart"). With
    ``redirect_to`` set, handshakes are answered with a 302 to it instead."""

    def __init__(self) -> None:
        self.redirect_to: str | None = None
        self.handshakes = 0
        self.connections = 0
        self.subscriptions: list[str] = []
        self._open: set[ServerConnection] = set()
        self._loop = asyncio.new_event_loop()
        self._server: Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="ws-server", daemon=True)
        self._thread.start()
        self._server = self._run(self._start())

    async def _start(self) -> Server:
        return await serve(self._handler, "127.0.0.1", 0, process_request=self._redirect)

    def _redirect(self, ws: ServerConnection, request: Request) -> Response | None:
        self.handshakes += 1
        if self.redirect_to is None:
            return None
        response = ws.respond(HTTPStatus.FOUND, "")
        response.headers["Location"] = self.redirect_to
        return response

    async def _handler(self, ws: ServerConnection) -> None:
        self.connections += 1
        subscription = await ws.recv()
        self.subscriptions.append(subscription if isinstance(subscription, str) else subscription.decode())
        self._open.add(ws)
        try:
            await ws.wait_closed()
        finally:
            self._open.discard(ws)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    @property
    def url(self) -> str:
        assert self._server is not None
        port = next(iter(self._server.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}/feed"

    def subscribed(self) -> int:
        """Connections that sent their subscription and are still open."""
        return len(self._open)

    def send(self, message: str) -> None:
        async def send_all() -> None:
            for ws in list(self._open):
                await ws.send(message)

        self._run(send_all())

    def drop(self) -> None:
        async def close_all() -> None:
            await asyncio.gather(*(ws.close(1012, "restarting") for ws in list(self._open)))

        self._run(close_all())

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()

        try:
            self._run(stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
