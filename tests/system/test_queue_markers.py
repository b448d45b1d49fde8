"""Every broker session binds each start queue it holds to a marker exchange of its own, whose
deletion with the queue says the queue was deleted (``observer_service/queue_watch.py``). No
session leaves its markers behind for good, however it ends: a graceful stop deletes them, a
session whose connection was lost has them deleted by the service's next session, and those
of a service killed are deleted by the manager when it forgets the service."""

from __future__ import annotations

from tests.system.test_reliability import close_connections
from tools import infra
from tools.harness import System, wait_for


def sessions_marking(rabbit: infra.RabbitNode, vhost: str) -> dict[str, set[str]]:
    """The queues marked, per session (``orch.watch.<session>.<queue>``)."""
    out = rabbit.ctl("list_exchanges", "-p", vhost, "-q", "--no-table-headers", "name")
    marked: dict[str, set[str]] = {}
    for line in out.splitlines():
        if line.strip().startswith("orch.watch."):
            session, queue = line.strip().removeprefix("orch.watch.").split(".", 1)
            marked.setdefault(session, set()).add(queue)
    return marked


def test_no_session_leaves_its_queue_markers_behind(system: System, rabbit: infra.RabbitNode, vhost: str) -> None:
    system.start_manager(ORCH_SERVICES_RETENTION_S="2", ORCH_START_QUEUES="2")
    stopped = system.start_service("svc-a", workers=5)
    system.start_service("svc-b", workers=5)
    killed = system.start_service("svc-c", workers=5)
    both = {"orch.start.default", "orch.start.default.1"}
    wait_for(
        lambda: list(sessions_marking(rabbit, vhost).values()) == [both] * 3,
        30,
        "three sessions marking both start queues",
    )
    before = set(sessions_marking(rabbit, vhost))

    assert stopped.terminate() == 0
    wait_for(lambda: len(sessions_marking(rabbit, vhost)) == 2, 30, "the stopped service's markers deleted")
    left = set(sessions_marking(rabbit, vhost))

    close_connections(rabbit, "svc-b")  # its holding connection: the session ends, the process lives
    wait_for(
        lambda: len(set(sessions_marking(rabbit, vhost)) - before) == 1,
        30,
        "svc-b's next session marking",
    )
    wait_for(lambda: len(sessions_marking(rabbit, vhost)) == 2, 30, "svc-b's lost session's markers deleted")

    killed.kill9()
    wait_for(
        lambda: len(sessions_marking(rabbit, vhost)) == 1,
        60,
        "the killed service's markers deleted once it is forgotten",
    )
    [(session, queues)] = sessions_marking(rabbit, vhost).items()
    assert session not in left and queues == both  # svc-b's new session's
