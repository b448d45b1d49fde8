"""Fixtures: the project's own RabbitMQ and PostgreSQL (started by ``tools.infra``, reused
when already running), a migrated template database, and per test a private vhost, a
private database and a ``System`` that starts real manager and service processes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools import infra
from tools.harness import REPO, System, unique

TEMPLATE_DB = "orch_test_template"


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
    line per tick (``tools.harness.probe_args``, ``read_ticks``): which host acted when."""
    system.env["PYTHONPATH"] = str(plugin_path)
    return system


@pytest.fixture
def vhost(rabbit: infra.RabbitNode) -> Iterator[str]:
    name = unique("t")
    rabbit.add_vhost(name)
    yield name
    rabbit.delete_vhost(name)


@pytest.fixture
def database(postgres: infra.PostgresNode) -> Iterator[str]:
    name = unique("t")
    postgres.create_database(name, template=TEMPLATE_DB)
    yield postgres.url(name)
    postgres.drop_database(name)


@pytest.fixture
def system(
    rabbit: infra.RabbitNode, vhost: str, database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[System]:
    sysm = System(amqp_url=rabbit.url_for(vhost), database_url=database, workdir=tmp_path)
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
