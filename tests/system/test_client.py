"""The typed client (``orchestrator_client``) against a real manager and service: its models
equal the live API's schema, every operation works sync and async, a 503 is waited out, and a
create whose answer was lost on the wire returns its own observer when sent again."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import socket
import subprocess
import sys
import threading
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from orchestrator_client import AsyncClient, Client, Conflict, NotFound, Unavailable, observer_spec
from orchestrator_client.models import SCHEMA_NAMES
from tools.harness import REPO, System, unique, wait_for


def test_the_models_are_the_live_schema(system: System) -> None:
    system.start_manager()
    schemas = system.get("/openapi.json").json()["components"]["schemas"]
    for model, name in SCHEMA_NAMES.items():
        schema = schemas.get(name) or schemas[f"{name}-Output"]
        fields = dataclasses.fields(model)
        assert {f.name for f in fields} == set(schema["properties"]), name
        # A field the model needs must be one the API always sends.
        needed = {
            f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        assert needed <= set(schema.get("required", [])), (name, needed - set(schema.get("required", [])))


def test_every_operation_sync(system: System) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=20)
    with Client(system.base_url) as client:
        name = unique("c")
        created = client.create(name, "ticker", {"interval_s": 5}, rebalance=False)
        assert created.name == name and isinstance(created.id, uuid.UUID) and not created.rebalance
        assert wait_for(lambda: client.get(name).status == "Processing", 30, "Processing")
        assert client.get(created.id).service_name == "svc-a"

        batch = client.bulk_create([observer_spec(f"{name}-{i}", "ticker", {"interval_s": 5}) for i in range(5)])
        assert [o.name for o in batch] == [f"{name}-{i}" for i in range(5)]
        # Pages of 2 followed to the end; a filter by service name.
        listed = [o.id for o in client.observers(page_size=2, q=name, sort="created")]
        assert len(listed) == 6 and listed[0] == created.id and set(listed) == {created.id} | {o.id for o in batch}
        wait_for(lambda: len(list(client.observers(service="svc-a", status="Processing"))) == 6, 30, "6 on svc-a")

        assert client.stop(batch[0].name).status == "OnDeleting"
        result = client.bulk_stop([batch[1].name, batch[2].id])
        assert set(result.stopping) == {batch[1].id, batch[2].id} and not result.unknown
        with pytest.raises(Conflict) as refused:
            client.restart(name)
        assert "Failed" in refused.value.detail
        with pytest.raises(NotFound):
            client.get(unique("nobody"))

        later = datetime.now(UTC) + timedelta(hours=1)
        scheduled = client.create(f"{name}-s", "ticker", {"interval_s": 5}, start_at=later)
        assert scheduled.status == "Scheduled"
        moved = client.reschedule(scheduled.name, later + timedelta(hours=1))
        assert moved.start_at == later + timedelta(hours=1)

        events = client.events(name)
        assert [e.event for e in events][:2] == ["created", "started"]
        service = next(s for s in client.services() if s.name == "svc-a")
        assert service.running == 4 or service.running >= 3  # stops may still be on their way
        assert client.drain("svc-a").draining and not client.uncordon(service.id).draining
        stats = client.stats()
        assert stats.observers["Processing"] + stats.observers["OnDeleting"] + stats.observers["Deleted"] >= 6
        assert stats.capacity["default"].total == 20
        assert client.history().period_s > 0
        assert "ticker" in {k.name for k in client.kinds()}


def test_every_operation_async(system: System) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=20)

    async def journey() -> None:
        async with AsyncClient(system.base_url) as client:
            name = unique("a")
            created = await client.create(name, "ticker", {"interval_s": 5})
            for _ in range(300):
                if (await client.get(name)).status == "Processing":
                    break
                await asyncio.sleep(0.1)
            batch = await client.bulk_create([observer_spec(f"{name}-{i}", "ticker") for i in range(3)])
            listed = [o.id async for o in client.observers(page_size=2, q=name)]
            assert len(listed) == 4 and set(listed) == {created.id} | {o.id for o in batch}
            assert (await client.stop(name)).status == "OnDeleting"
            assert set((await client.bulk_stop([o.name for o in batch])).stopping) == {o.id for o in batch}
            with pytest.raises(NotFound):
                await client.restart(unique("nobody"))
            assert [e.event for e in await client.events(created.id)][:2] == ["created", "started"]
            assert (await client.drain("svc-a")).draining
            assert not (await client.uncordon("svc-a")).draining
            assert (await client.stats()).capacity["default"].total == 20
            assert (await client.history()).period_s > 0
            assert {s.name for s in await client.services()} == {"svc-a"}
            assert "ticker" in {k.name for k in await client.kinds()}

    asyncio.run(journey())


def test_a_503_is_waited_out(system: System) -> None:
    """A create in a pool no live service serves is 503 with Retry-After; the service that
    serves it starts meanwhile, and the create sent again is accepted."""
    system.start_manager()
    with Client(system.base_url, retries=8) as client:
        with pytest.raises(Unavailable) as refused:
            Client(system.base_url, retries=0).create(unique("p"), "ticker", pool="late")
        assert "late" in refused.value.detail
        threading.Timer(1.0, lambda: system.start_service("svc-late", wait=False, ORCH_POOLS="late")).start()
        created = client.create(unique("p"), "ticker", pool="late")
        assert created.pool == "late"


class LossyProxy:
    """A TCP proxy to the manager that can lose answers: a connection taken while ``lose`` is
    positive forwards its request and reads the manager's answer, then closes the client's
    side without passing it on (what a dropped connection or a proxy restart does)."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.lose = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        lose = self.lose > 0
        self.lose -= lose
        with client, socket.create_connection(("127.0.0.1", self.upstream)) as upstream:
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            if lose:
                upstream.recv(65536)  # the answer, read and dropped
                client.shutdown(socket.SHUT_RDWR)
                return
            self._pump(upstream, client)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()


def test_a_create_whose_answer_was_lost_returns_its_own_observer(system: System) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=5)
    proxy = LossyProxy(system.manager_port)
    try:
        with Client(f"http://127.0.0.1:{proxy.port}") as client:
            name = unique("lost")
            proxy.lose = 1
            created = client.create(name, "ticker", {"interval_s": 5})
            assert proxy.lose == 0  # the first answer was lost indeed (a new client: a new connection)
            assert [o.id for o in client.observers(name=name)] == [created.id]
            # Someone else's observer of that name is still a conflict, answer lost or not.
            with pytest.raises(Conflict):
                client.create(name, "ticker", {"interval_s": 6})
        with Client(f"http://127.0.0.1:{proxy.port}") as client:  # a new connection: the proxy takes it
            proxy.lose = 1
            with pytest.raises(Conflict):
                client.create(name, "ticker", {"interval_s": 7})
            assert proxy.lose == 0
    finally:
        proxy.close()


def test_the_readme_program_runs(system: System) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=5)
    readme = (REPO / "README.md").read_text()
    program = re.search(r"<!-- client-example[^>]*-->\n```python\n(.*?)```", readme, re.DOTALL)
    assert program is not None, "the README's client example is gone"
    assert len(program.group(1).strip().splitlines()) <= 12
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")} | {"ORCH_URL": system.base_url}
    result = subprocess.run(
        [sys.executable, "-c", program.group(1)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "Created" in result.stdout or "Processing" in result.stdout
    assert httpx.get(f"{system.base_url}/api/observers", params={"name": "btc-watch"}).json()["items"][0]["status"] in (
        "OnDeleting",
        "Deleted",
    )
