"""Observer kinds that misbehave on purpose, for ``tests/unit/test_isolation.py``; they run in a
child process (``tests.isolation_kinds:NAME``). Each first emits ``{"pid": os.getpid()}`` so
that the test knows which process to watch.

Also a stand-in for the runner's ``Context`` and ``python -m tests.isolation_kinds NAME``, a
small service process whose child the orphan test leaves behind by killing the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
import uuid
from typing import Any

from pydantic import BaseModel, field_validator

from shared.errors import LeaseLost
from shared.observer_api import ObserverContext, ObserverKind


class Count(BaseModel):
    count: int = 0


class NoArgs(BaseModel):
    pass


class SlowStart(BaseModel):
    """Validating these args takes ``load_delay_s``: a child starting on a busy host."""

    load_delay_s: float

    @field_validator("load_delay_s")
    @classmethod
    def _slow(cls, value: float) -> float:
        time.sleep(value)
        return value


async def _hello(ctx: ObserverContext) -> None:
    await ctx.emit({"pid": os.getpid()})


async def emitter(args: Count, ctx: ObserverContext) -> None:
    await _hello(ctx)
    for n in range(args.count):
        await ctx.emit({"n": n})


async def cooperative(args: NoArgs, ctx: ObserverContext) -> None:
    await _hello(ctx)
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await ctx.emit({"stopping": ctx.stopping.is_set()})
        raise


async def stubborn(args: NoArgs, ctx: ObserverContext) -> None:
    """Ignores its stop: swallows CancelledError while a thread sleeps."""
    await _hello(ctx)
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.to_thread(time.sleep, 3600)


async def exiter(args: NoArgs, ctx: ObserverContext) -> None:
    await _hello(ctx)
    await asyncio.sleep(0.2)
    os._exit(3)


async def hog(args: NoArgs, ctx: ObserverContext) -> None:
    await _hello(ctx)
    chunks = []
    while True:
        chunks.append(b"x" * 5 * 2**20)  # touched pages, so they count in RSS: ~50 MiB/s
        await asyncio.sleep(0.1)


async def spinner(args: NoArgs, ctx: ObserverContext) -> None:
    await _hello(ctx)
    while True:
        pass


async def lease_checker(args: BaseModel, ctx: ObserverContext) -> None:
    await _hello(ctx)
    tick = 0
    while True:
        tick += 1
        ctx.ensure_lease()
        await ctx.emit({"tick": tick})
        await asyncio.sleep(0.1)


async def raiser(args: NoArgs, ctx: ObserverContext) -> None:
    await _hello(ctx)
    raise ValueError("boom 42")


async def printer(args: NoArgs, ctx: ObserverContext) -> None:
    # All of this must end up on stderr, not in the protocol.
    print('{"op": "done"}')
    print("not json at all", flush=True)
    sys.stdout.write("half a line")
    sys.stdout.flush()
    os.write(1, b'{"op": "error", "type": "X", "message": "fake"}\n')
    threading.Thread(target=print, args=("from a thread",)).start()
    await _hello(ctx)
    await ctx.emit({"after_print": True})


CRASHER = ObserverKind(name="crasher", args_model=NoArgs, run=exiter, isolation="process")
EMITTER = ObserverKind(name="emitter", args_model=Count, run=emitter, isolation="process")
COOPERATIVE = ObserverKind(name="cooperative", args_model=NoArgs, run=cooperative, isolation="process")
STUBBORN = ObserverKind(name="stubborn", args_model=NoArgs, run=stubborn, isolation="process")
HOG = ObserverKind(name="hog", args_model=NoArgs, run=hog, isolation="process")
SPINNER = ObserverKind(name="spinner", args_model=NoArgs, run=spinner, isolation="process")
LEASE_CHECKER = ObserverKind(name="lease_checker", args_model=NoArgs, run=lease_checker, isolation="process")
SLOW_STARTER = ObserverKind(name="slow_starter", args_model=SlowStart, run=lease_checker, isolation="process")
RAISER = ObserverKind(name="raiser", args_model=NoArgs, run=raiser, isolation="process")
PRINTER = ObserverKind(name="printer", args_model=NoArgs, run=printer, isolation="process")


class FakeService:
    """Stands in for ``observer_service.runner.Context``: the test sets the lease deadline,
    and emits are collected (after the same lease check as the real one)."""

    def __init__(self, *, lease_s: float = 3600.0, on_emit: Any = None) -> None:
        self.observer_id = uuid.uuid4()
        self.name = "iso-test"
        self.kind = "test"
        self.service_id = uuid.uuid4()
        self.stopping = asyncio.Event()
        self.logger = logging.LoggerAdapter(logging.getLogger("observer.test"), {})
        self.deadline = time.monotonic() + lease_s
        self.emitted: list[dict[str, Any]] = []
        self._on_emit = on_emit

    def lease_deadline(self) -> float:
        return self.deadline

    def ensure_lease(self) -> None:
        if time.monotonic() >= self.deadline:
            raise LeaseLost("test lease lapsed")

    async def emit(self, payload: dict[str, Any]) -> None:
        self.ensure_lease()
        self.emitted.append(payload)
        if self._on_emit is not None:
            self._on_emit(payload)

    def pid(self) -> int:
        return int(self.emitted[0]["pid"])


def _service_main(name: str) -> None:
    """Run one child and print its pid on stdout, for a test to kill this service."""
    from observer_service.isolation import ProcessLimits, run_in_process

    service = FakeService(on_emit=lambda p: print(p.get("pid", ""), flush=True))
    asyncio.run(run_in_process(f"tests.isolation_kinds:{name}", {}, service, ProcessLimits()))


if __name__ == "__main__":
    _service_main(sys.argv[1])
