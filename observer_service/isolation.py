"""``isolation = "process"``: run one observer in a supervised child process (parent side).

The runner awaits ``run_in_process(ref, args, ctx, limits)`` instead of ``kind.run(args,
ctx)``; the child is ``python -m observer_service.child <parent pid> <observer id>``.

* Spawn, never fork: the service holds AMQP sockets and a running event loop that a forked
  copy must not touch. cwd and environment are inherited; the start spec (kind reference,
  args, observer id/name/kind, service id, log level) is stdin's first line.
* Protocol, JSON lines. To the child (stdin): the spec, ``{"op": "lease", "until": t}``,
  ``{"op": "go", "until": t}``, ``{"op": "stop"}``. From the child (its original stdout):
  ``{"op": "ready"}`` (kind loaded, args valid; answered by ``go``, the deadline to start
  under: a start slowed by a busy host must not act on, or trip over, a stale one),
  ``{"op": "alive"}``, ``{"op": "emit", "payload": {...}}``, finally ``{"op": "done"}`` or
  ``{"op": "error", "type", "message"}``.
  The child keeps the protocol on a dup of fd 1 and points fd 1 at stderr, so print() in
  observer code lands in the log; its logs go to the inherited stderr as ``[observer:<id>]``.
* Fencing: the child acts only until the deadline the parent last sent, which is
  ``ctx.lease_deadline()`` at ``go`` and whenever it changes (polled every 0.25 s). It is a
  ``time.monotonic()`` value: CLOCK_MONOTONIC is one system-wide clock on Linux, so it means
  the same instant in both processes, and the child's copy can only lag (the safe side).
  Deadline 0 (session gone) → SIGKILL at once; cancelled while it is 0 (fence) → no grace.
  ``LeaseLost`` in the child is raised here as ``LeaseLost``: the runner fences the session
  as for an async observer.
* Emits: the child checks its lease and writes (ordered, fire-and-forget but for pipe
  back-pressure); the parent forwards each with ``await ctx.emit()``, which checks again. A
  failing ``ctx.emit`` kills the child and its exception is raised here. Nothing the child
  wrote is forwarded once the parent decided to kill it.
* Stop (this coroutine cancelled): ``stop`` (the child sets ``ctx.stopping`` and cancels its
  run task; its emits meanwhile are dropped, as an async observer's are refused), up to ``stop_grace_s``, SIGKILL, reap,
  re-raise ``CancelledError``.
* Cheap on the service's loop: this coroutine reads the child's lines (no extra task), plus
  one timer callback every 0.25 s: lease; liveness (the child's loop says ``alive`` every
  second; silent for ``liveness_timeout_s``, or 30 s before its first line: blocked or
  CPU-bound → SIGKILL); every 0.5 s the child's RSS from ``/proc/<pid>/statm`` (Linux-only;
  the child alone, not processes it starts; over ``memory_limit_mb`` → SIGKILL). Reaping is
  asyncio's (Python 3.11's default child watcher: a thread blocked in waitpid() per child).
* No orphans: the child gets SIGKILL from the kernel when its parent dies (PR_SET_PDEATHSIG;
  works even while it hogs the CPU) and exits on stdin EOF. It ignores SIGINT/SIGTERM, which
  a terminal or systemd send to the whole group: the service ends its children itself.
* Cost: a child is a whole Python interpreter, tens of MiB (measured: docs/design.md, "The
  observer runtime"). A ``memory_limit_mb`` below ~50 kills a child about as soon as it has
  started.
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
from dataclasses import dataclass
from typing import Any, Protocol

from shared.errors import LeaseLost
from shared.linux import statm_resident_bytes

PIPE = asyncio.subprocess.PIPE

logger = logging.getLogger(__name__)

_TICK_S = 0.25  # lease poll and liveness check; RSS every other tick
_STARTUP_S = 30.0  # liveness allowance until the child's first line (imports on a busy host)
_LINE_LIMIT = 16 * 2**20  # longest protocol line (an emit payload) we accept


@dataclass(frozen=True)
class ProcessLimits:
    memory_limit_mb: float | None = None  # RSS watchdog; None = no limit
    liveness_timeout_s: float | None = None  # the child must show life this often; None = no check
    stop_grace_s: float = 5.0  # after the cooperative stop signal, then SIGKILL


class ObserverProcessError(Exception):
    """The observer's child process crashed, exceeded its memory, hung or the observer raised."""


class RunnerContext(Protocol):  # what this needs of the runner's ``Context``
    observer_id: uuid.UUID
    name: str
    kind: str
    service_id: uuid.UUID

    @property
    def stopping(self) -> asyncio.Event: ...

    def lease_deadline(self) -> float: ...

    async def emit(self, payload: dict[str, Any]) -> None: ...


async def run_in_process(kind_ref: str, args: dict[str, Any], ctx: RunnerContext, limits: ProcessLimits) -> None:
    """Run the kind in a child; return when its ``run()`` returned normally. Raise
    ``LeaseLost`` if the child hit a lapsed lease or the session went away, the exception of a
    failed ``ctx.emit``, else ``ObserverProcessError`` (crash, memory, hang, or the observer
    raised: type and message). On cancellation: stop, grace, SIGKILL, reap, re-raise."""
    argv = (sys.executable, "-m", "observer_service.child", str(os.getpid()), str(ctx.observer_id))
    proc = await asyncio.create_subprocess_exec(*argv, stdin=PIPE, stdout=PIPE, limit=_LINE_LIMIT)
    sup = _Supervisor(proc, ctx, limits)
    try:
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        ids = {"observer_id": str(ctx.observer_id), "service_id": str(ctx.service_id)}
        sup.start({"kind_ref": kind_ref, "args": args, "name": ctx.name, "kind": ctx.kind, "log_level": level, **ids})
        try:
            await sup.pump()
            await proc.wait()
        except asyncio.CancelledError:
            await sup.stop()
            raise
    finally:
        await sup.close()
    sup.raise_outcome()


class _Supervisor:
    def __init__(self, proc: asyncio.subprocess.Process, ctx: RunnerContext, limits: ProcessLimits) -> None:
        self.proc = proc
        self.ctx = ctx
        self.limits = limits
        self.loop = asyncio.get_running_loop()
        self.last_seen = self.last_tick = time.monotonic()
        self.sent_until = 0.0
        self.heard = False  # any line from the child yet
        self.emitting = False  # a slow ctx.emit holds the reader back: that is no hung child
        self.outcome: dict[str, Any] | None = None  # the child's "done" or "error"
        self.verdict: BaseException | None = None  # why the parent killed the child
        self.ticks = 0
        self.timer: asyncio.TimerHandle | None = None
        # Opened once: a read is then one pread(), and never reads a recycled pid's file.
        self.statm: int | None = None
        with contextlib.suppress(OSError):
            self.statm = os.open(f"/proc/{proc.pid}/statm", os.O_RDONLY)

    def start(self, spec: dict[str, Any]) -> None:
        self.send(spec)
        self.tick()  # a session already gone kills the child before it starts acting

    def send(self, message: dict[str, Any]) -> None:
        stdin = self.proc.stdin
        if stdin is not None and self.proc.returncode is None and not stdin.is_closing():
            stdin.write(json.dumps(message).encode() + b"\n")  # buffered, never blocks the loop

    def kill(self, verdict: BaseException | None) -> None:
        if self.verdict is None:
            self.verdict = verdict
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    def tick(self) -> None:
        self.timer = None
        if self.proc.returncode is not None:
            return
        now = time.monotonic()
        until = self.ctx.lease_deadline()
        if until <= 0:
            logger.warning("observer %s: its session is gone: killing its process", self.ctx.observer_id)
            self.kill(LeaseLost("the broker session of this observer is gone; its process was killed"))
            return
        if until != self.sent_until:
            self.sent_until = until
            self.send({"op": "lease", "until": until})
        self.ticks += 1
        if self.limits.memory_limit_mb is not None and self.ticks % 2 == 0:
            self.check_memory(self.limits.memory_limit_mb)
        if self.emitting:
            self.last_seen = now
        # After the loop itself stalled, the child's lines may be waiting unread: judge only
        # on a tick that came on time.
        on_time = now - self.last_tick < 4 * _TICK_S
        self.last_tick = now
        timeout = self.limits.liveness_timeout_s
        allowed = None if timeout is None else timeout if self.heard else max(timeout, _STARTUP_S)
        if allowed is not None and on_time and now - self.last_seen > allowed:
            silent = now - self.last_seen
            logger.error("observer %s: no sign of life for %.1fs: killing", self.ctx.observer_id, silent)
            self.kill(ObserverProcessError(f"hung: no sign of life for {silent:.1f}s (> {allowed}s); killed"))
            return
        self.timer = self.loop.call_later(_TICK_S, self.tick)

    def check_memory(self, limit_mb: float) -> None:
        if self.statm is None:
            return
        try:
            rss_mb = statm_resident_bytes(os.pread(self.statm, 256, 0)) / 2**20
        except (OSError, ValueError, IndexError):
            return  # the process is exiting
        if rss_mb > limit_mb:
            logger.error("observer %s: RSS %.0f MiB > %s MiB: killing", self.ctx.observer_id, rss_mb, limit_mb)
            self.kill(ObserverProcessError(f"memory limit exceeded: RSS {rss_mb:.0f} MiB > {limit_mb} MiB; killed"))

    async def pump(self) -> None:
        """Read the child's lines until EOF; forward its emits in order."""
        stdout = self.proc.stdout
        assert stdout is not None
        while True:
            try:
                line = await stdout.readline()
            except ValueError:  # a line over _LINE_LIMIT
                self.kill(ObserverProcessError(f"protocol line longer than {_LINE_LIMIT} bytes; killed"))
                return
            if not line:
                return
            self.last_seen = time.monotonic()
            self.heard = True
            try:
                message = json.loads(line)
                op = message["op"]
            except (ValueError, TypeError, KeyError):
                self.kill(ObserverProcessError(f"protocol error: {line[:200]!r}; killed"))
                return
            if op == "emit" and self.verdict is None:
                await self.forward(message.get("payload"))
            elif op == "ready":  # loaded: the deadline to start acting under, after any queued one
                self.sent_until = self.ctx.lease_deadline()
                self.send({"op": "go", "until": self.sent_until})
            elif op in ("done", "error"):
                self.outcome = message

    async def forward(self, payload: Any) -> None:
        if self.ctx.stopping.is_set():
            # The body is told to stop: its delivery may be settled any moment now, and an
            # async observer's emits are refused from here on too (``Context.ensure_lease``).
            logger.debug("observer %s: dropping an emit made while stopping", self.ctx.observer_id)
            return
        self.emitting = True
        try:
            await self.ctx.emit(payload)
        except Exception as e:  # noqa: BLE001 - the service's verdict on this observer, raised to the runner
            logger.warning("observer %s: emit failed (%r): killing its process", self.ctx.observer_id, e)
            self.kill(e)
        finally:
            self.emitting = False

    async def stop(self) -> None:
        """The cooperative stop, then SIGKILL after the grace; none for a fenced observer."""
        if self.proc.returncode is not None:
            return
        if self.ctx.lease_deadline() <= 0:
            self.kill(None)
            return
        self.send({"op": "stop"})
        try:
            async with asyncio.timeout(self.limits.stop_grace_s):
                await self.pump()  # its emits are dropped meanwhile (``forward``)
                await self.proc.wait()
        except TimeoutError:
            grace = self.limits.stop_grace_s
            logger.error("observer %s ignored its stop for %.1fs: killing its process", self.ctx.observer_id, grace)
            self.kill(None)

    async def close(self) -> None:
        """Never leave the child behind: kill it if it still runs, and reap it."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.kill(None)
        await self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self.statm is not None:
            os.close(self.statm)
            self.statm = None

    def raise_outcome(self) -> None:
        if self.verdict is not None:
            raise self.verdict
        outcome = self.outcome or {}
        code = self.proc.returncode
        if outcome.get("op") == "done" and code == 0:
            return
        if outcome.get("op") == "error":
            kind, message = outcome.get("type"), outcome.get("message")
            if kind == "LeaseLost":
                raise LeaseLost(f"in the observer's process: {message}")
            raise ObserverProcessError(f"observer raised {kind}: {message}")
        raise ObserverProcessError(f"observer process {_describe_exit(code)} without reporting an outcome")


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"
