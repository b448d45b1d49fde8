"""The manager given several PostgreSQL hosts in SQLAlchemy's multi-host form (a primary and
its standbys behind a switchover tool): it uses the one that answers as the primary, for
writes and for the API's reads alike."""

from __future__ import annotations

import socket

from sqlalchemy.engine import make_url

from tools.harness import System


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_manager_given_several_hosts_uses_the_primary(system: System) -> None:
    """Before, the API's read-only sessions failed asyncpg's read-write check on every host
    and ``/readyz`` said ``database: unreachable: InternalError`` for ever."""
    url = make_url(system.database_url)
    hosts = f"host=127.0.0.1:{_closed_port()}&host={url.host}:{url.port}"
    multi = url.set(host=None, port=None).render_as_string(hide_password=False)
    system.start_manager(ORCH_DATABASE_URL=f"{multi}?{hosts}&target_session_attrs=read-write")
    system.start_service("svc-a", workers=5)
    oid = system.create("on-the-primary", args={"interval_s": 0.5})["id"]
    system.wait_status(oid, "Processing")
    assert system.get("/readyz").status_code == 200
    assert [o["id"] for o in system.observers()] == [oid]
