"""The state process as seen from the API process: spawned, watched, restarted, stopped.

``python -m manager`` spawns the child before it imports the API (FastAPI, SQLAlchemy,
pydantic), so the two processes import side by side and the state consumer starts applying a
backlog that much sooner after a manager restart (figures: docs/design.md, "Two processes
for the manager"). This module is the spawner, so it stays light: it must not import the
state side (``manager.state_side``) or anything heavy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys

logger = logging.getLogger(__name__)

METRICS_FD_ENV = "ORCH_STATE_METRICS_FD"  # set by the parent for its child
PARENT_PID_ENV = "ORCH_STATE_PARENT_PID"
_RESTART_AFTER_S = 1.0
_STOP_GRACE_S = 10.0


class StateSupervisor:
    """One state process of this manager.

    :meth:`spawn` may run before the event loop exists (``python -m manager`` calls it first
    thing); :meth:`start` (in the API's lifespan) spawns it if that did not happen and begins
    watching it. Both must run on the thread that runs the event loop for the life of the
    process: the child's ``PR_SET_PDEATHSIG`` follows the thread that spawned it
    (``shared.linux.die_with_parent``).
    """

    def __init__(self) -> None:
        # The child's metrics socket is bound here, kept open for this process's life and
        # handed to each child (``pass_fds``), so the port is this manager's from the start
        # and across restarts: a port picked with bind(0) and closed is free again, and any
        # process's next bind(0) may take it first (docs/bench-history.md, "2026-11-28,
        # twelfth session").
        self._metrics_socket = socket.create_server(("127.0.0.1", 0))
        self.metrics_port: int = self._metrics_socket.getsockname()[1]
        self._proc: subprocess.Popen[bytes] | None = None
        self._watch: asyncio.Task[None] | None = None

    def spawn(self) -> None:
        fd = self._metrics_socket.fileno()
        env = os.environ | {METRICS_FD_ENV: str(fd), PARENT_PID_ENV: str(os.getpid())}
        # Same stdout/stderr as the manager: one log for both halves.
        self._proc = subprocess.Popen([sys.executable, "-m", "manager.state_side"], env=env, pass_fds=(fd,))
        logger.info("state process started (pid %d)", self._proc.pid)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> None:
        if self._proc is None:
            self.spawn()
        self._watch = asyncio.create_task(self._keep_running(), name="state-process")

    async def _keep_running(self) -> None:
        while True:
            assert self._proc is not None
            code = await asyncio.to_thread(self._proc.wait)
            logger.error("state process exited with %s; starting it again in %.0fs", code, _RESTART_AFTER_S)
            await asyncio.sleep(_RESTART_AFTER_S)
            self.spawn()

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(BaseException):
                await self._watch
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, _STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait)

    async def metrics_text(self) -> str:
        """The child's counters in the Prometheus text format ('' while it is unreachable)."""
        import httpx  # here: the state process imports this module's names, and not httpx (0.1 s)

        try:
            async with httpx.AsyncClient(timeout=2.0) as client:
                response = await client.get(f"http://127.0.0.1:{self.metrics_port}/metrics")
                response.raise_for_status()
                return response.text
        except httpx.HTTPError:
            return ""
