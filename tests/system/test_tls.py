"""TLS on every connection (issue 63, item 1), with a real RabbitMQ and PostgreSQL that speak
TLS only to clients with a certificate (mutual TLS).

Certificates by ``tools/pki.py``: the servers' name 127.0.0.1 only, so a server reached as
``localhost`` is one whose certificate does not name the host connected to; a second CA, that
signed nothing here, stands for a CA file pointing at the wrong authority.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.system.test_cli import cli
from tools import infra
from tools.harness import REPO, System, free_port, unique, wait_for
from tools.pki import Pki, make_pki, tls_nodes


@dataclass
class TlsWorld:
    pki: Pki
    rabbit: infra.RabbitNode
    postgres: infra.PostgresNode

    def env(self, **changes: str) -> dict[str, str]:
        """The TLS settings of every process here, with ``changes``."""
        return self.pki.env() | changes


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsWorld]:
    base = tmp_path_factory.mktemp("tls")
    pki = make_pki(base / "pki")
    rabbit, postgres = tls_nodes(base, pki)
    world = TlsWorld(pki, rabbit, postgres)
    try:
        rabbit.start()
        postgres.start()
        postgres.create_database("orch")
        # Alembic over TLS too: it reads the manager's settings.
        tls = {key: value for key, value in world.env().items() if key.startswith("ORCH_DATABASE_")}
        env = {"PATH": "/usr/bin:/bin", "ORCH_DATABASE_URL": postgres.url("orch")} | tls
        subprocess.run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=REPO, env=env, check=True)
        yield world
    finally:
        rabbit.destroy()
        postgres.destroy()


@pytest.fixture
def system(world: TlsWorld, tmp_path: Path) -> Iterator[System]:
    vhost = unique("t")
    world.rabbit.add_vhost(vhost)
    database = unique("t")
    world.postgres.create_database(database, template="orch")
    sysm = System(amqp_url=world.rabbit.tls_url_for(vhost), database_url=world.postgres.url(database), workdir=tmp_path)
    sysm.env |= world.env()
    yield sysm
    sysm.stop_all()
    world.rabbit.delete_vhost(vhost)
    world.postgres.drop_database(database)


def _refused(system: System, phrase: str, **env: str) -> str:
    """Start a manager with ``env``; it must exit with status 2, saying ``phrase``."""
    manager = system.start_manager(wait=False, **env)
    assert manager.popen.wait(60) == 2, manager.text()[-3000:]
    text = manager.text()
    assert phrase in text, text[-3000:]
    return text


def test_a_create_runs_and_moves_with_every_connection_over_tls(system: System, world: TlsWorld) -> None:
    system.start_manager()
    services = {name: system.start_service(name, workers=5) for name in ("svc-a", "svc-b")}
    created = system.create("over-tls")
    service = system.wait_status(created["id"], "Processing", timeout=60)["service_name"]

    services[service].kill9()
    wait_for(
        lambda: system.observer(created["id"])["service_name"] not in (None, service),
        60,
        "the observer moved to the other service",
    )
    assert system.observer(created["id"])["status"] == "Processing"

    # Every connection of ours is a TLS one: the API's, the state process's, the probes', each
    # service's sessions and holding connections (the node has a plain listener too).
    vhost = system.amqp_url.rsplit("/", 1)[1]
    rows = [line.split("\t") for line in world.rabbit.ctl("list_connections", "vhost", "ssl", "-q").splitlines()]
    ours = [ssl for name, ssl, *_ in rows if name == vhost]
    assert len(ours) >= 4 and all(ssl == "true" for ssl in ours), rows
    # PostgreSQL takes nothing else (hostssl only), and says each of ours is TLS.
    plain = world.postgres.psql(
        "SELECT count(*) FROM pg_stat_activity JOIN pg_stat_ssl USING (pid) WHERE client_addr IS NOT NULL AND NOT ssl"
    )
    assert plain.strip() == "0"


def test_a_broker_certificate_the_client_cannot_verify_is_refused_naming_the_setting(
    system: System, world: TlsWorld
) -> None:
    other = str(world.pki.other_ca)
    _refused(system, "set ORCH_AMQP_CA_FILE to the CA that signed it", ORCH_AMQP_CA_FILE=other)
    # A service says it as a refusal, not as an outage, and keeps trying; its /readyz says
    # why it is not ready (it never reaches the broker, so the manager cannot list it).
    port = free_port()
    service = system.start_service("svc-other-ca", wait=False, ORCH_AMQP_CA_FILE=other, ORCH_METRICS_PORT=str(port))
    wait_for(lambda: "set ORCH_AMQP_CA_FILE to the CA that signed it" in service.text(), 30, "the refusal said")
    assert service.alive()
    ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    assert ready.status_code == 503 and "set ORCH_AMQP_CA_FILE" in ready.json()["detail"], ready.text


def test_a_broker_reached_by_a_name_its_certificate_lacks_is_refused(system: System, world: TlsWorld) -> None:
    wrong_host = system.amqp_url.replace("@127.0.0.1:", "@localhost:")
    _refused(system, "does not name the host connected to", ORCH_AMQP_URL=wrong_host)


def test_a_client_without_the_certificate_the_broker_asks_for_is_refused(system: System) -> None:
    _refused(system, "refused this client's certificate", ORCH_AMQP_CERT_FILE="", ORCH_AMQP_KEY_FILE="")


def test_a_database_certificate_the_client_cannot_verify_or_a_wrong_host_is_refused(
    system: System, world: TlsWorld
) -> None:
    _refused(
        system, "set ORCH_DATABASE_CA_FILE to the CA that signed it", ORCH_DATABASE_CA_FILE=str(world.pki.other_ca)
    )
    wrong_host = system.database_url.replace("@127.0.0.1:", "@localhost:")
    _refused(system, "does not name the host connected to", ORCH_DATABASE_URL=wrong_host)


def test_the_api_over_https_verified_by_the_cli(system: System, world: TlsWorld) -> None:
    server = world.pki.server
    system.https_ca = world.pki.ca  # the harness's own requests verify it too
    system.start_manager(ORCH_MANAGER_TLS_CERT_FILE=str(server.cert), ORCH_MANAGER_TLS_KEY_FILE=str(server.key))
    system.start_service("svc-a", workers=5)
    assert system.base_url.startswith("https://")

    shown = cli(system.base_url, "--json", "stats", env={"ORCH_CA_FILE": str(world.pki.ca)})
    assert shown.returncode == 0 and json.loads(shown.stdout)["services"]["alive"] == 1, shown.stderr
    # Without the CA, or by a name the certificate lacks: refused, saying what to set.
    for url, env in (
        (system.base_url, {}),
        (system.base_url.replace("127.0.0.1", "localhost"), {"ORCH_CA_FILE": str(world.pki.ca)}),
    ):
        refused = cli(url, "stats", env=env)
        assert refused.returncode == 3, refused.stderr
        assert "a certificate this client cannot verify" in refused.stderr and "ORCH_CA_FILE" in refused.stderr


def test_a_database_url_of_several_hosts_works_over_tls(system: System, world: TlsWorld) -> None:
    """The switchover URL's form (``tools/infra/pg_pair.py``): each host is tried in turn, and
    the one that answers is verified by its own name. The first one here is down."""
    credentials, database = (
        system.database_url.split("//", 1)[1].split("@", 1)[0],
        system.database_url.rsplit("/", 1)[1],
    )
    hosts = f"host=127.0.0.1:{free_port()}&host=127.0.0.1:{world.postgres.port}"
    system.database_url = f"postgresql+asyncpg://{credentials}@/{database}?{hosts}&target_session_attrs=read-write"
    system.start_manager()
    system.start_service("svc-a", workers=2)
    created = system.create("several-hosts")
    assert system.wait_status(created["id"], "Processing", timeout=60)["service_name"] == "svc-a"
