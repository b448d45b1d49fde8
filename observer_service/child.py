"""``python -m observer_service.child <parent pid> <observer id>``: one process-isolated observer.

Started by ``observer_service.isolation.run_in_process``, which documents the protocol. Here:
keep the protocol on a private fd, die with the parent, read the start spec from stdin, load
the kind, say ``ready``, and on ``go`` run ``kind.run(args, ctx)`` with a context that acts
only under the lease the parent sent; obey ``stop``; report how the run ended and exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

from shared.errors import LeaseLost
from shared.linux import die_with_parent
from shared.logs import LogFormat, configure_logging, set_service_id

if TYPE_CHECKING:
    from pydantic import BaseModel

    from shared.observer_api import ObserverKind

_ALIVE_EVERY_S = 1.0

logger = logging.getLogger("observer_service.child")


class ChildContext:
    """The ``ObserverContext`` of a process-isolated observer."""

    def __init__(self, spec: dict[str, Any], out: asyncio.StreamWriter) -> None:
        self.observer_id = uuid.UUID(spec["observer_id"])
        self.name: str = spec["name"]
        self.kind: str = spec["kind"]
        self.service_id = uuid.UUID(spec["service_id"])
        self.stopping = asyncio.Event()
        self.logger = logging.LoggerAdapter(
            logging.getLogger(f"observer.{self.kind}"), {"observer_id": spec["observer_id"]}
        )
        self.lease_until = 0.0  # until the parent's "go"
        self._out = out

    def ensure_lease(self) -> None:
        # The parent's deadline, on the same CLOCK_MONOTONIC as ours.
        lapsed = time.monotonic() - self.lease_until
        if self.lease_until <= 0:
            raise LeaseLost("no lease: the service is not connected to the broker")
        if lapsed >= 0:
            raise LeaseLost(f"lease lapsed {lapsed:.3f}s ago: this service may no longer own this observer")

    async def emit(self, payload: dict[str, Any]) -> None:
        self.ensure_lease()
        send(self._out, {"op": "emit", "payload": payload})
        await self._out.drain()  # waits only when the parent lags far behind (back-pressure)


def _log_format() -> LogFormat:
    # The service's environment is inherited: its ORCH_LOG_FORMAT applies here too.
    return "json" if os.environ.get("ORCH_LOG_FORMAT", "").lower() == "json" else "text"


def send(out: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    out.write(json.dumps(message).encode() + b"\n")


def main() -> None:
    # First of all, before any import of observer code can print: the protocol gets a
    # private copy of fd 1, and fd 1 (print, os.write(1, ...)) goes to stderr.
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    # A terminal's Ctrl-C or systemd's SIGTERM reach the whole process group; the service
    # decides when its children stop (it hands them off on its own SIGTERM).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Even while observer code hogs the CPU (stdin EOF needs a free event loop).
    die_with_parent(int(sys.argv[1]))
    asyncio.run(_main(protocol_fd))


async def _main(protocol_fd: int) -> None:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(protocol_fd, "wb", buffering=0)
    )
    out = asyncio.StreamWriter(transport, protocol, None, loop)
    inp = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(inp), sys.stdin)
    line = await inp.readline()
    if not line:
        os._exit(1)  # the parent is gone already
    spec = json.loads(line)
    configure_logging(spec["log_level"], f"observer:{spec['observer_id']}", _log_format())
    set_service_id(spec["service_id"])
    control = _Control(ChildContext(spec, out))
    background = [asyncio.create_task(control.listen(inp)), asyncio.create_task(_alive(out))]
    try:
        from shared.kinds import load_ref  # heavy (pydantic, kinds): a failure here is reported too

        kind = load_ref(spec["kind_ref"])
        args = kind.parse_args(spec["args"])
    except Exception as e:  # reported to the parent, which fails the observer
        logger.exception("cannot start observer kind %s", spec["kind_ref"])
        await _finish(out, _error(e))
        return
    # Loading may take seconds on a busy host, with lease renewals queued unread meanwhile:
    # act only on the deadline the parent sends in answer to "ready" (it comes after them).
    send(out, {"op": "ready"})
    await control.go.wait()
    outcome = await control.run(kind, args) if not control.stop_requested else {"op": "done"}
    for task in background:
        task.cancel()
    await _finish(out, outcome)


class _Control:
    """The run task of the observer, and what the parent says about it."""

    def __init__(self, ctx: ChildContext) -> None:
        self.ctx = ctx
        self.go = asyncio.Event()  # set by the parent's "go" (or a stop before it)
        self.stop_requested = False
        self.task: asyncio.Task[None] | None = None

    async def run(self, kind: ObserverKind[Any], args: BaseModel) -> dict[str, Any]:
        self.task = task = asyncio.create_task(_run(kind, args, self.ctx), name=f"observer {self.ctx.observer_id}")
        await asyncio.wait([task])
        if task.cancelled():
            return {"op": "done"} if self.stop_requested else _error(asyncio.CancelledError("cancelled from inside"))
        if (error := task.exception()) is not None:
            if not isinstance(error, LeaseLost):
                logger.error("observer failed", exc_info=error)
            return _error(error)
        return {"op": "done"}

    async def listen(self, inp: asyncio.StreamReader) -> None:
        while line := await inp.readline():
            message = json.loads(line)
            if message["op"] in ("lease", "go"):
                self.ctx.lease_until = float(message["until"])
            if message["op"] == "go":
                self.go.set()
            elif message["op"] == "stop":
                self.stop_requested = True
                self.ctx.stopping.set()
                self.go.set()
                if self.task is not None:
                    self.task.cancel()
        # EOF: the parent is gone. Stop acting at once, without unwinding anything.
        os._exit(1)


async def _run(kind: ObserverKind[Any], args: BaseModel, ctx: ChildContext) -> None:
    await kind.run(args, ctx)


async def _alive(out: asyncio.StreamWriter) -> None:
    while True:
        send(out, {"op": "alive"})
        await asyncio.sleep(_ALIVE_EVERY_S)


def _error(error: BaseException) -> dict[str, Any]:
    kind = "LeaseLost" if isinstance(error, LeaseLost) else type(error).__name__  # the parent re-raises it as such
    return {"op": "error", "type": kind, "message": str(error)}


async def _finish(out: asyncio.StreamWriter, outcome: dict[str, Any]) -> None:
    """Report the outcome and exit now: threads the observer left behind (to_thread, an
    executor) must not hold the process, and asyncio.run would join them."""
    send(out, outcome)
    # drain() alone returns below the high-water mark: wait for an empty buffer instead.
    out.transport.set_write_buffer_limits(high=0)
    with contextlib.suppress(Exception):
        await out.drain()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
