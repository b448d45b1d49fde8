"""``isolation = "process"``: the supervision of a real child process (real signals, no mocks
of the OS). ``run_in_process`` runs here with a stand-in service context (``FakeService``); the
observer kinds live in ``tests/isolation_kinds.py``. No broker needed. Timing bounds are
loose on purpose: the CI machine has two cores shared with other tests."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from observer_service.isolation import ObserverProcessError, ProcessLimits, run_in_process
from shared.errors import LeaseLost
from tests.isolation_kinds import FakeService
from tools.harness import REPO

pytestmark = pytest.mark.timeout(120)


def ref(name: str) -> str:
    return f"tests.isolation_kinds:{name}"


def _children(pid: int) -> set[int]:
    """Direct children of ``pid`` that run Python (zombies included): observer children.
    Other children are not these tests': the session's vhost pool (``tests/system/conftest.py``)
    makes and deletes vhosts with ``rabbitmqctl`` on a thread of this process meanwhile."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, _, tail = stat.read_text().rpartition(")")
        except OSError:
            continue
        if int(tail.split()[1]) == pid and head.partition("(")[2].startswith("python"):
            found.add(int(stat.parent.name))
    return found


def _state(pid: int) -> str | None:
    """The process state letter (``Z`` for a zombie), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return None


@pytest.fixture(autouse=True)
def no_leftover_children() -> Iterator[None]:
    before = _children(os.getpid())
    yield
    left = _children(os.getpid()) - before
    assert not left, f"child processes left behind: {left}"


async def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def assert_gone(pid: int) -> None:
    assert _state(pid) is None, f"child {pid} still exists (state {_state(pid)})"


async def started(service: FakeService, task: asyncio.Task[None]) -> int:
    """Wait for the child's hello; return its pid."""
    await wait_until(lambda: bool(service.emitted) or task.done())
    assert service.emitted, f"the child never said hello: {task}"
    return service.pid()


async def test_emits_reach_the_service_in_order_and_a_normal_return_returns() -> None:
    service = FakeService()
    await run_in_process(ref("EMITTER"), {"count": 500}, service, ProcessLimits())
    assert [p["n"] for p in service.emitted[1:]] == list(range(500))
    assert_gone(service.pid())


async def test_cancel_stops_cooperatively_within_the_grace() -> None:
    service = FakeService()
    task = asyncio.create_task(run_in_process(ref("COOPERATIVE"), {}, service, ProcessLimits(stop_grace_s=30)))
    pid = await started(service, task)
    t0 = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - t0 < 20  # the grace is 30 s: it ended by itself, not by SIGKILL
    assert service.emitted[-1] == {"stopping": True}  # its ctx.stopping was set, its emit forwarded
    assert_gone(pid)


async def test_a_child_ignoring_its_stop_is_killed_after_the_grace() -> None:
    service = FakeService()
    task = asyncio.create_task(run_in_process(ref("STUBBORN"), {}, service, ProcessLimits(stop_grace_s=1.5)))
    pid = await started(service, task)
    t0 = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert 1.4 <= time.monotonic() - t0 < 20
    assert_gone(pid)


async def test_a_crash_reports_the_exit_code() -> None:
    service = FakeService()
    with pytest.raises(ObserverProcessError, match="exited with code 3"):
        await run_in_process(ref("CRASHER"), {}, service, ProcessLimits())
    assert_gone(service.pid())


async def test_a_memory_hog_is_killed() -> None:
    service = FakeService()
    with pytest.raises(ObserverProcessError, match=r"memory limit exceeded: RSS \d+ MiB > 100"):
        await run_in_process(ref("HOG"), {}, service, ProcessLimits(memory_limit_mb=100))
    assert_gone(service.pid())


async def test_a_cpu_bound_child_does_not_block_the_service_and_is_killed_as_hung() -> None:
    service = FakeService()
    max_lag = 0.0

    async def measure_lag() -> None:
        nonlocal max_lag
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(0.05)
            max_lag = max(max_lag, time.monotonic() - t0 - 0.05)

    probe = asyncio.create_task(measure_lag())
    t0 = time.monotonic()
    try:
        with pytest.raises(ObserverProcessError, match="hung"):
            await run_in_process(ref("SPINNER"), {}, service, ProcessLimits(liveness_timeout_s=2))
    finally:
        probe.cancel()
    assert service.emitted, "the spinner said hello before spinning"
    assert 2 <= time.monotonic() - t0 < 30
    assert max_lag < 0.5, f"the service's event loop lagged {max_lag:.3f}s"
    assert_gone(service.pid())


async def test_lease_renewals_reach_the_child_and_a_lapse_raises_lease_lost() -> None:
    service = FakeService(lease_s=1.0)
    task = asyncio.create_task(run_in_process(ref("LEASE_CHECKER"), {}, service, ProcessLimits()))
    pid = await started(service, task)
    renew_until = time.monotonic() + 3
    while time.monotonic() < renew_until:  # renewed like the real lease: valid a while ahead
        service.deadline = time.monotonic() + 1.0
        await asyncio.sleep(0.2)
    acted_late = len(service.emitted)
    assert not task.done()
    with pytest.raises(LeaseLost):
        await task  # renewals stop: within ~1 s the child's ensure_lease() raises
    assert acted_late > 15  # it kept acting for 3 s on renewed leases (a tick every 0.1 s)
    assert all(service.emitted)
    assert_gone(pid)


async def test_a_slow_start_acts_on_the_current_lease_not_the_one_at_spawn() -> None:
    service = FakeService(lease_s=1.0)

    async def renew() -> None:
        while True:
            service.deadline = time.monotonic() + 1.0
            await asyncio.sleep(0.2)

    renewer = asyncio.create_task(renew())
    limits = ProcessLimits(liveness_timeout_s=1.0)  # the start is allowed more than that
    task = asyncio.create_task(run_in_process(ref("SLOW_STARTER"), {"load_delay_s": 2.5}, service, limits))
    try:
        await wait_until(lambda: len(service.emitted) >= 5 or task.done())
        assert not task.done(), task  # no LeaseLost: it checked the lease right after its start
    finally:
        renewer.cancel()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert_gone(service.pid())


async def test_a_session_gone_kills_the_child_at_once() -> None:
    service = FakeService()
    task = asyncio.create_task(run_in_process(ref("STUBBORN"), {}, service, ProcessLimits(stop_grace_s=60)))
    pid = await started(service, task)
    t0 = time.monotonic()
    service.deadline = 0.0
    with pytest.raises(LeaseLost):
        await task
    assert time.monotonic() - t0 < 10  # no cooperation needed, no grace waited
    assert_gone(pid)


async def test_cancelled_while_fenced_kills_without_grace() -> None:
    service = FakeService()
    task = asyncio.create_task(run_in_process(ref("STUBBORN"), {}, service, ProcessLimits(stop_grace_s=60)))
    pid = await started(service, task)
    t0 = time.monotonic()
    service.deadline = 0.0
    task.cancel()  # the runner's fence() cancels right after the session closed
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - t0 < 10
    assert_gone(pid)


async def test_an_exception_in_the_observer_surfaces_with_type_and_message() -> None:
    service = FakeService()
    with pytest.raises(ObserverProcessError, match="ValueError: boom 42"):
        await run_in_process(ref("RAISER"), {}, service, ProcessLimits())
    assert_gone(service.pid())


async def test_bad_reference_or_args_fail_the_observer() -> None:
    with pytest.raises(ObserverProcessError, match="ModuleNotFoundError"):
        await run_in_process("tests.no_such_module:KIND", {}, FakeService(), ProcessLimits())
    with pytest.raises(ObserverProcessError, match="ValidationError"):
        await run_in_process(ref("EMITTER"), {"count": "many"}, FakeService(), ProcessLimits())


async def test_print_in_the_child_does_not_break_the_protocol() -> None:
    service = FakeService()
    await run_in_process(ref("PRINTER"), {}, service, ProcessLimits())
    assert service.emitted[1:] == [{"after_print": True}]


async def test_a_failed_emit_in_the_service_kills_the_child_and_raises() -> None:
    def refuse(payload: dict[str, object]) -> None:
        if "n" in payload:
            raise RuntimeError("broker said no")

    service = FakeService(on_emit=refuse)
    with pytest.raises(RuntimeError, match="broker said no"):
        await run_in_process(ref("EMITTER"), {"count": 100}, service, ProcessLimits())
    assert len(service.emitted) == 2  # hello and n=0 (appended before refused); nothing after
    assert_gone(service.pid())


def test_the_child_dies_with_its_service_even_while_spinning() -> None:
    """The service is SIGKILLed: no cleanup runs there, and the spinning child cannot see stdin
    EOF; the kernel's parent-death signal ends it."""
    service = subprocess.Popen(
        [sys.executable, "-m", "tests.isolation_kinds", "SPINNER"], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert service.stdout is not None
        child = int(service.stdout.readline())
        assert _state(child) in ("R", "S")
    finally:
        service.send_signal(signal.SIGKILL)
        service.wait()
    deadline = time.monotonic() + 30
    while _state(child) not in (None, "Z"):  # a zombie is dead; PID 1 of a container may not reap
        assert time.monotonic() < deadline, f"orphan {child} still running"
        time.sleep(0.05)
