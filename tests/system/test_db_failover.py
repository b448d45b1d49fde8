"""A PostgreSQL switchover under load (issue 55): the manager is given a primary and its
streaming replica (``tools/infra/pg_pair.py``), the primary is killed (``kill -9``) and the
replica promoted while creates, stops and state reports flow. Meanwhile the API answers 503
with ``Retry-After``; after the promotion it works again without a restart, and nothing the
API acknowledged is lost or applied twice."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.system.test_two_managers import _leader, _second, event_counts
from tools import infra
from tools.harness import REPO, System, free_port, wait_for
from tools.infra.pg_pair import PgPair

# The load's own bound on an answer: a request that waits this long counts as hanging.
_CLIENT_TIMEOUT_S = 10.0
_OUTAGE_ANSWERS = 5  # calls answered while the primary is dead, before the promotion
_LEADER_TIMEOUT_S = 4.0
_OUTAGE_S = 3.0


@dataclass(frozen=True)
class Call:
    op: str  # "create" or "stop"
    target: str  # the observer's name (create) or id (stop)
    status: int | None  # None: no answer within _CLIENT_TIMEOUT_S, or the connection failed
    retry_after: str | None
    began: float  # time.monotonic()
    ended: float
    observer_id: str | None = None  # of a create answered 201


class Load(threading.Thread):
    """Creates observers one after another through the API and stops every third one a
    second or more after its create was answered, recording every answer."""

    def __init__(self, system: System) -> None:
        super().__init__(name="load", daemon=True)
        self.base_url = system.base_url
        self.calls: list[Call] = []
        self.done = threading.Event()

    def run(self) -> None:
        created: list[tuple[float, str]] = []  # (answered at, id), oldest first
        with httpx.Client(base_url=self.base_url, timeout=_CLIENT_TIMEOUT_S) as client:
            for i in range(100_000):
                if self.done.is_set():
                    return
                call = self._call(client, "create", f"load-{i}")
                if call.observer_id is not None:
                    created.append((call.ended, call.observer_id))
                # A stop a second after the create: its start has usually been reported.
                if i % 3 == 2 and created and time.monotonic() - created[0][0] > 1.0:
                    self._call(client, "stop", created.pop(0)[1])
                time.sleep(0.05)

    def _call(self, client: httpx.Client, op: str, target: str) -> Call:
        began = time.monotonic()
        status, retry_after, observer_id = None, None, None
        try:
            if op == "create":
                response = client.post("/api/observers", json={"name": target, "kind": "ticker", "args": {}})
            else:
                response = client.delete(f"/api/observers/{target}")
            status, retry_after = response.status_code, response.headers.get("retry-after")
            if status == 201:
                observer_id = response.json()["id"]
        except httpx.HTTPError:
            pass
        call = Call(op, target, status, retry_after, began, time.monotonic(), observer_id)
        self.calls.append(call)
        return call

    def answered_since(self, since: float) -> list[Call]:
        return [c for c in list(self.calls) if c.began >= since]


@pytest.fixture
def pair(rabbit: infra.RabbitNode, tmp_path: Path) -> Iterator[PgPair]:
    """A primary and its synchronous replica, the schema migrated through the multi-host URL
    (after ``rabbit``, whose ``infra.up()`` installs PostgreSQL's packages if missing)."""
    pg = PgPair(tmp_path / "pair", (free_port(), free_port()))
    try:
        pg.start()
        env = {"PATH": "/usr/bin:/bin", "ORCH_DATABASE_URL": pg.url()}
        subprocess.run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=REPO, env=env, check=True)
        yield pg
    finally:
        pg.destroy()


@pytest.fixture
def failover_system(
    rabbit: infra.RabbitNode, vhost: str, pair: PgPair, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[System]:
    system = System(amqp_url=rabbit.url_for(vhost), database_url=pair.url(), workdir=tmp_path)
    yield system
    system.stop_all()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(system.logs())


def test_a_switchover_under_load_loses_nothing_and_applies_nothing_twice(failover_system: System, pair: PgPair) -> None:
    system = failover_system
    manager = system.start_manager(ORCH_LEADER_TIMEOUT_S=str(_LEADER_TIMEOUT_S))
    state_process = manager.state_process()
    assert state_process is not None  # else "not restarted" below would compare two Nones
    system.start_service("svc-a", workers=200)
    system.start_service("svc-b", workers=200)
    before = [system.create(f"before-{i}", args={"interval_s": 0.5})["id"] for i in range(10)]
    for observer in before:
        system.wait_status(observer, "Processing")

    load = Load(system)
    load.start()
    try:
        wait_for(lambda: sum(c.status == 201 for c in load.calls) >= 20, 30, "creates before the fault")

        # The primary crashes: every call until the promotion is refused, reads included. The
        # outage outlasts the leader lock's check (a quarter of ORCH_LEADER_TIMEOUT_S), so the
        # state side also gives up the lead and takes it again on the promoted node.
        pair.kill_primary()
        killed_at = time.monotonic()
        time.sleep(_OUTAGE_S)
        wait_for(lambda: len(load.answered_since(killed_at)) >= _OUTAGE_ANSWERS, 30, "calls during the outage")
        ready, listing = system.get("/readyz"), system.get("/api/observers")
        promoting_at = time.monotonic()
        pair.promote()
        promoted_at = time.monotonic()

        # The same manager process takes writes again on the promoted replica.
        def written_after() -> bool:
            done = Counter(c.op for c in load.answered_since(promoted_at) if c.status in (201, 202))
            return done["create"] >= 10 and done["stop"] >= 2

        wait_for(written_after, 60, "creates and stops answered after the promotion")
    finally:
        load.done.set()
        load.join(_CLIENT_TIMEOUT_S + 5)
    wait_for(lambda: system.get("/readyz").status_code == 200, 60, "/readyz 200 after the promotion")
    assert manager.alive() and system.manager is manager
    assert manager.state_process() == state_process, "the state process was restarted"

    # During the outage: 503 with Retry-After, never a 500 or a hang.
    assert ready.status_code == 503, ready.text
    assert listing.status_code == 503 and int(listing.headers["retry-after"]) > 0, listing.text
    outage = [c for c in load.calls if c.began >= killed_at and c.ended <= promoting_at]
    assert len(outage) >= _OUTAGE_ANSWERS
    assert all(c.status == 503 and c.retry_after and int(c.retry_after) > 0 for c in outage), outage
    assert {c.status for c in load.calls} <= {201, 202, 503}, Counter(c.status for c in load.calls)

    # Every acknowledged create exists once and runs, or is Deleted if its stop was
    # acknowledged. A create or stop refused with 503 may have committed before the crash
    # (its answer lost): it may exist, or be stopped, but still only once.
    created = {c.target: c.observer_id for c in load.calls if c.op == "create" and c.status == 201}
    stopped = {c.target for c in load.calls if c.op == "stop" and c.status == 202}
    unsure_stops = {c.target for c in load.calls if c.op == "stop" and c.status != 202}
    attempted = {c.target for c in load.calls if c.op == "create"}

    def settled() -> list[dict[str, Any]]:  # empty (falsy) until every observer is Processing or Deleted
        found = system.observers()
        return found if all(o["status"] in ("Processing", "Deleted") for o in found) else []

    found = wait_for(settled, 60, "every observer Processing or Deleted", every=0.5)
    by_name = Counter(str(o["name"]) for o in found)
    assert all(count == 1 for count in by_name.values()), by_name.most_common(3)
    assert set(by_name) <= attempted | {f"before-{i}" for i in range(10)}
    status_of = {str(o["id"]): o["status"] for o in found}
    for name, observer in created.items():
        assert observer in status_of, f"{name} ({observer}) was created (201) and is lost"
        if observer in stopped:
            expected = {"Deleted"}
        elif observer in unsure_stops:
            expected = {"Processing", "Deleted"}
        else:
            expected = {"Processing"}
        assert status_of[observer] in expected, (name, observer, status_of[observer])
    for observer in before:
        assert status_of[observer] == "Processing"

    # Nothing applied twice: one created and one started per observer (no service died, so
    # none moved), and one stopped per Deleted one.
    events = event_counts(system.database_url)
    for observer, status in status_of.items():
        assert events[(observer, "created")] == 1, observer
        # A stop may have come before the start was reported: a Deleted one started at most once.
        assert events[(observer, "started")] == 1 or (status == "Deleted" and events[(observer, "started")] == 0)
        assert events[(observer, "stopped")] == (1 if status == "Deleted" else 0), observer
    assert not any(event in ("moved", "released", "host_lost", "failed") for _, event in events)

    first_write = min(c.ended for c in load.answered_since(promoted_at) if c.status in (201, 202))
    print(
        f"calls: {dict(Counter((c.op, c.status) for c in load.calls))}; outage {promoted_at - killed_at:.1f}s; "
        f"first write {first_write - promoted_at:.2f}s after the promotion; "
        f"created though answered 503: {len(set(by_name) - set(created) - {f'before-{i}' for i in range(10)})}; "
        f"stopped though answered 503: {sum(status_of.get(o) == 'Deleted' for o in unsure_stops)}; "
        f"events: {dict(Counter(event for _, event in events))}"
    )


def test_a_manager_that_reaches_a_hot_standby_does_not_lead(failover_system: System, pair: PgPair) -> None:
    """Issue 62, item 7: PostgreSQL grants an advisory lock on a hot standby, so a manager given
    the replica's address alone took the leader lock there, beside the leader on the primary.
    The leader proves it can write: on the standby the write is refused, and it stands by."""
    a, b = failover_system, _second(failover_system)
    try:
        a.start_manager(ORCH_MANAGER_NAME="manager-a")
        wait_for(lambda: _leader(a) == "manager-a", 30, "manager-a to lead")
        manager_b = b.start_manager(wait=False, ORCH_MANAGER_NAME="manager-b", ORCH_DATABASE_URL=pair.replica.url())
        wait_for(lambda: "the database this manager reached refuses writes" in manager_b.text(), 30, "b standing by")
        time.sleep(3)  # three of its attempts to lead
        assert "now applies state reports" not in manager_b.text()
        assert _leader(a) == "manager-a"
        a.start_service("svc-a", workers=5)  # the leader on the primary applies reports as before
        created = a.create("after-b", args={"interval_s": 1})
        a.wait_status(created["id"], "Processing")
    finally:
        b.stop_all()
