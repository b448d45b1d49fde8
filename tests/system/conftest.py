"""Fixtures: the project's own RabbitMQ and PostgreSQL (started by ``tools.infra``, reused
when already running), a migrated template database, and per test a private vhost, a
private database and a ``System`` that starts real manager and service processes (the
vhosts made ahead and deleted behind on a thread: ``VhostPool``)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import aio_pika
import pytest
from aio_pika.abc import AbstractQueue
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.db.engine import make_engine, make_sessionmaker
from shared import topology
from tools import infra
from tools.harness import REPO, System, unique

TEMPLATE_DB = "orch_test_template"
_BATCH = 8  # vhosts made per rabbitmqctl call


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--queue-type",
        choices=("classic", "quorum"),
        help="every process a System starts declares its queues of this type (ORCH_QUEUE_TYPE): "
        "make test-quorum runs the placement suites so on one node",
    )


@pytest.fixture(scope="session")
def rabbit() -> infra.RabbitNode:
    infra.up()
    return infra.rabbit_node()


@pytest.fixture(scope="session")
def postgres(rabbit: infra.RabbitNode) -> infra.PostgresNode:
    pg = infra.postgres_node()
    pg.drop_database(TEMPLATE_DB)
    pg.create_database(TEMPLATE_DB)
    env = {"PATH": "/usr/bin:/bin", "ORCH_DATABASE_URL": pg.url(TEMPLATE_DB)}
    subprocess.run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=REPO, env=env, check=True)
    return pg


@pytest.fixture(scope="session")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test plug-in package (tests/plugin_pkg) installed by pip into a directory of its
    own; services that get it on PYTHONPATH discover its kinds through entry points."""
    work = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(REPO / "tests" / "plugin_pkg", work / "src")  # keep build files out of the repo
    target = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", target, source],
        check=True,
    )
    return target


@pytest.fixture
def with_test_plugin(system: System, plugin_path: Path) -> System:
    """Every process ``system`` starts gets the test plug-in, whose ``probe`` kind leaves a
    line per tick (``tools.harness.probe_args``, ``read_ticks``): which service acted when."""
    system.env["PYTHONPATH"] = str(plugin_path)
    return system


class VhostPool:
    """Vhosts made ahead, a batch at a time, and deleted behind, on a thread of their own.

    Every rabbitmqctl call boots an Erlang VM, about a CPU second on this machine, on the
    cores the tests run on: a test's vhost took three calls (add, permissions, delete). Now
    one call makes a batch of ``_BATCH``, and one deletes every vhost given back since the
    last delete began."""

    def __init__(self, rabbit: infra.RabbitNode) -> None:
        self.rabbit = rabbit
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="vhosts")
        self._ready: list[str] = []
        self._next = self._worker.submit(self._make)
        self._lock = threading.Lock()
        self._returned: list[str] = []  # given back, not yet taken by a delete
        self._deletes: list[Future[None]] = []

    def _make(self) -> list[str]:
        names = [unique("t") for _ in range(_BATCH)]
        self.rabbit.add_vhosts(names)
        return names

    def take(self) -> str:
        if not self._ready:
            try:
                self._ready = self._next.result()
            except infra.InfraError:  # made while a test had the broker down: make them now
                self._ready = self._make()
            self._next = self._worker.submit(self._make)
        return self._ready.pop()

    def give_back(self, name: str) -> None:
        with self._lock:
            self._returned.append(name)
            if len(self._returned) > 1:
                return  # a delete is queued and has not taken its names yet: it takes this one too
        self._deletes.append(self._worker.submit(self._delete_returned))

    def _delete_returned(self) -> None:
        with self._lock:
            names, self._returned = self._returned, []
        self.rabbit.delete_vhosts(names)

    def close(self) -> None:
        with contextlib.suppress(infra.InfraError):
            self._ready += self._next.result()
        for name in self._ready:
            self.give_back(name)
        for deleted in self._deletes:
            with contextlib.suppress(infra.InfraError):  # a broker a test left down: nothing to clean
                deleted.result()
        self._worker.shutdown()


@pytest.fixture(scope="session")
def vhosts(rabbit: infra.RabbitNode) -> Iterator[VhostPool]:
    pool = VhostPool(rabbit)
    yield pool
    pool.close()


@pytest.fixture
def vhost(rabbit: infra.RabbitNode, vhosts: VhostPool) -> Iterator[str]:
    if not rabbit.is_running():  # a fault test that failed before it restarted the broker
        rabbit.start()
    name = vhosts.take()
    yield name
    vhosts.give_back(name)


@pytest.fixture
async def state_queue(rabbit: infra.RabbitNode, vhost: str) -> AsyncIterator[AbstractQueue]:
    """The vhost's state queue as the manager declares it: what a service run in the test's
    own process reports, read with ``get``."""
    connection = await aio_pika.connect(rabbit.url_for(vhost))
    try:
        channel = await connection.channel()
        await topology.declare_common(channel)
        yield await topology.declare_state_queue(channel)
    finally:
        await connection.close()


@pytest.fixture
def database(postgres: infra.PostgresNode) -> Iterator[str]:
    # One fault test that failed with PostgreSQL stopped used to fail every test after it.
    if not postgres.is_running():
        postgres.start()
    name = unique("t")
    postgres.create_database(name, template=TEMPLATE_DB)
    yield postgres.url(name)
    postgres.drop_database(name)


@pytest.fixture
async def sessions(database: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """Sessions on the test's own database, for tests that drive manager code in-process."""
    engine = make_engine(database)
    yield make_sessionmaker(engine)
    await engine.dispose()


@pytest.fixture
def system(
    rabbit: infra.RabbitNode, vhost: str, database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[System]:
    sysm = System(amqp_url=rabbit.url_for(vhost), database_url=database, workdir=tmp_path)
    queue_type = request.config.getoption("--queue-type", default=None)
    if queue_type:
        sysm.env["ORCH_QUEUE_TYPE"] = queue_type
    yield sysm
    sysm.stop_all()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(sysm.logs())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    setattr(item, f"rep_{report.when}", report)  # type: ignore[attr-defined]
    return report
