"""How the manager's state side starts (``manager/__main__.py``, ``manager/state_side.py``).

The state process is spawned before the manager reads its settings, and connects to the
broker while it checks the database's schema: both so that a restarted manager begins
applying its backlog sooner. Neither may cost what the old order guaranteed: a manager whose
settings are wrong leaves no state process behind, and a state process on a database whose
schema is behind applies nothing and acks nothing until it is migrated.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy.engine import make_url

from shared import topology
from tests.system.test_migrations import alembic
from tools import infra
from tools.harness import System, wait_for

CHILD_MARK = "ORCH_STATE_PARENT_PID"  # manager.state.supervisor.PARENT_PID_ENV


def state_processes_of(manager_pid: int) -> list[int]:
    """The state processes that manager spawned and that still run (by their environment)."""
    mark = f"{CHILD_MARK}={manager_pid}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            continue
        if mark in environ:
            found.append(int(entry.name))
    return found


def test_the_state_process_is_spawned_before_the_settings_are_read(system: System) -> None:
    manager = system.start_manager()
    assert "before the settings were read" in manager.text()
    assert len(state_processes_of(manager.popen.pid)) == 1
    system.start_service("svc-a")  # waits until the state process has applied its birth


def test_a_manager_whose_settings_are_wrong_leaves_no_state_process(system: System) -> None:
    # The child is spawned before the parent reads ORCH_STATE_PREFETCH (it must be >= 1):
    # it must end with its parent.
    manager = system.start_manager(wait=False, ORCH_STATE_PREFETCH="0")
    assert manager.popen.wait(60) != 0
    assert "invalid setting ORCH_STATE_PREFETCH" in manager.text()
    wait_for(lambda: not state_processes_of(manager.popen.pid), 30, "the state process to end with its parent")


async def test_a_state_process_on_an_outdated_schema_applies_nothing_until_it_is_migrated(
    system: System, postgres: infra.PostgresNode
) -> None:
    alembic(system.database_url, "downgrade", "-1")
    # A service and no manager (the queues as a manager declares them): its birth and
    # heartbeats wait in the state queue.
    await asyncio.to_thread(system.amqp, topology.declare_common)
    system.start_service("svc-a")
    await asyncio.to_thread(wait_for, lambda: queued(system)[0] >= 3, 60, "the service's reports to wait")
    system.stop_all()
    waiting = (await asyncio.to_thread(queued, system))[0]

    # The state process alone, so that it is its own schema check that holds it back. It
    # waits for the migration (a Job may be running it) and consumes only once it leads,
    # after the check: meanwhile every report stays in the queue.
    state = system.start_process("state", "manager.state_side")
    await asyncio.to_thread(
        wait_for, lambda: "waiting for the database's migrations" in state.text(), 60, "the state process to wait"
    )
    await asyncio.sleep(2)
    assert state.alive() and "database schema is at revision" in state.text()
    assert await asyncio.to_thread(queued, system) == (waiting, 0)
    database = make_url(system.database_url).database
    assert database
    assert postgres.psql("SELECT count(*) FROM services", database=database).strip() == "0"

    # Migrated, it goes on by itself: the reports are applied.
    alembic(system.database_url, "upgrade", "head")
    await asyncio.to_thread(
        wait_for,
        lambda: postgres.psql("SELECT count(*) FROM services", database=database).strip() == "1",
        60,
        "the service's birth applied",
    )
    assert "the schema is up to date" in state.text()


def queued(system: System) -> tuple[int, int]:
    """(ready messages, consumers) of the state queue."""
    return system.queue_counts(topology.STATE_QUEUE)
