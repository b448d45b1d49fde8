"""The ``orchestrator`` command line, run as a real subprocess against a real manager and
service: what it prints, and its exit codes (0 ok, 1 API error, 2 usage, 3 unreachable).
Also that it stays a client: no server module loaded, installable by the base dependencies."""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path
from typing import Any, get_args

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tools.harness import REPO, System, free_port, unique, wait_for


def cli(
    url: str, *args: str, token: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # The caller's ORCH_URL / ORCH_TOKEN must not leak into the test.
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")} | (env or {})
    command = [sys.executable, "-m", "cli", "--url", url, *(["--token", token] if token else []), *args]
    return subprocess.run(command, cwd=REPO, env=base_env, capture_output=True, text=True, timeout=120)


def cli_json(url: str, *args: str) -> Any:
    result = cli(url, "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.usefixtures("with_test_plugin")  # its probe kind has a string arg
def test_create_list_show_stop_and_errors(system: System, tmp_path: Path) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=5)
    url = system.base_url
    name = unique("cli")

    # create: --arg values are JSON when they parse (0.5 is a number), else strings (the path)
    created = cli_json(url, "create", name, "probe", "--arg", "interval_s=0.5", "--arg", f"log_file={tmp_path}/t.log")
    assert created["name"] == name
    assert created["args"]["interval_s"] == 0.5 and created["args"]["log_file"] == f"{tmp_path}/t.log"
    observer_id = created["id"]
    uuid.UUID(observer_id)  # the full id, not a shortened one

    # It becomes Processing, as `show --json` says
    shown = wait_for(
        lambda: (o := cli_json(url, "show", observer_id))["status"] == "Processing" and o, 60, "Processing"
    )
    assert shown["service_name"] == "svc-a"
    assert [e["event"] for e in shown["events"]][:2] == ["created", "started"]

    # list shows it in a table; filters reach the API
    listed = cli(url, "list")
    assert listed.returncode == 0, listed.stderr
    assert name in listed.stdout and "Processing" in listed.stdout
    assert name in cli(url, "list", "--status", "processing", "--service", "svc-a", "--search", name[-6:]).stdout
    assert cli_json(url, "list", "--status", "Failed")["items"] == []
    assert [o["id"] for o in cli_json(url, "list", "--kind", "probe", "--limit", "1", "--all")["items"]] == [
        observer_id
    ]

    # show (table) prints the full id and the history
    table = cli(url, "show", observer_id)
    assert table.returncode == 0, table.stderr
    assert observer_id in table.stdout and "started" in table.stdout and "svc-a" in table.stdout

    # restart of an observer that is not Failed: the API's 409, on stderr, exit 1
    refused = cli(url, "restart", observer_id)
    assert refused.returncode == 1
    assert "409" in refused.stderr and "Failed" in refused.stderr, refused.stderr
    assert refused.stdout == ""

    # bad args: the 422 names the field
    bad = cli(url, "create", unique("bad"), "ticker", "--arg", "interval_s=-1")
    assert bad.returncode == 1
    assert "422" in bad.stderr and "interval_s" in bad.stderr, bad.stderr

    # a name in use: 409
    taken = cli(url, "create", name, "ticker")
    assert taken.returncode == 1 and "409" in taken.stderr

    # unknown id: 404
    missing = cli(url, "show", str(uuid.uuid4()))
    assert missing.returncode == 1 and "404" in missing.stderr

    # a name wherever an id is taken; a shortened id from a table is no name: said so
    assert cli_json(url, "show", name)["id"] == observer_id
    for args in (["show", "8080a915"], ["restart", "8080a915"]):
        short = cli(url, *args)
        assert short.returncode == 1 and "404" in short.stderr and "in full" in short.stderr, short.stderr

    # stop → OnDeleting at once, Deleted eventually
    stopped = cli(url, "stop", observer_id)
    assert stopped.returncode == 0, stopped.stderr
    assert "OnDeleting" in stopped.stdout
    wait_for(lambda: cli_json(url, "show", observer_id)["status"] == "Deleted", 60, "Deleted")

    # several ids: one bulk stop; an unknown id among them is exit 1, the known ones stop anyway
    others = [cli_json(url, "create", unique("bulk"), "ticker")["id"] for _ in range(2)]
    unknown = str(uuid.uuid4())
    bulk = cli(url, "stop", *others, unknown)
    assert bulk.returncode == 1 and unknown in bulk.stderr, bulk.stderr
    assert "stopping 2" in bulk.stdout
    wait_for(lambda: all(cli_json(url, "show", o)["status"] == "Deleted" for o in others), 60, "bulk Deleted")


def test_kinds_services_stats_watch(system: System) -> None:
    system.start_manager()
    system.start_service("svc-a", workers=5)
    url = system.base_url
    cli_json(url, "create", unique("w"), "ticker", "--args-json", '{"interval_s": 1}')

    kinds = cli(url, "kinds")
    assert kinds.returncode == 0, kinds.stderr
    assert "ticker" in kinds.stdout and "interval_s" in kinds.stdout
    assert {"ticker", "http_poll", "websocket", "periodic"} <= {k["name"] for k in cli_json(url, "kinds")}

    services = cli(url, "services")
    assert services.returncode == 0 and "svc-a" in services.stdout and "alive" in services.stdout

    stats = cli_json(url, "stats")
    assert stats["capacity"]["default"]["total"] == 5 and stats["services"]["alive"] == 1
    table = cli(url, "stats")
    assert table.returncode == 0 and "default" in table.stdout and "Processing" in table.stdout
    if "kinds" in stats:
        assert "ticker" in table.stdout

    watched = cli(url, "watch", "--iterations", "1")
    assert watched.returncode == 0, watched.stderr
    assert "svc-a" in watched.stdout and "observers" in watched.stdout

    lines = cli(url, "--json", "watch", "--iterations", "2", "--interval", "0.2").stdout.splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["services"][0]["name"] == "svc-a"

    # Drained by name, the service is shown draining; uncordoned, it takes starts again
    pinned = cli_json(url, "create", unique("p"), "ticker", "--no-rebalance")
    assert pinned["rebalance"] is False
    drained = cli_json(url, "drain", "svc-a")
    assert drained["name"] == "svc-a" and drained["draining"] is True
    assert "draining" in cli(url, "services").stdout
    said = cli(url, "uncordon", "svc-a")
    assert said.returncode == 0 and "svc-a: takes new starts" in said.stdout, said.stdout
    assert cli(url, "drain", "no-such-service").returncode == 1


def test_unreachable_manager_is_exit_3() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    for args in (["list"], ["stats"], ["watch", "--iterations", "1"]):
        result = cli(url, *args)
        assert result.returncode == 3, (args, result.stderr)
        assert url in result.stderr


def test_silent_manager_is_exit_3_after_the_timeout() -> None:
    with socket.socket() as listener:  # accepts connections (the kernel's backlog), never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        result = cli(url, "--timeout", "0.5", "stats")
    assert result.returncode == 3, result.stderr
    assert url in result.stderr and "0.5s" in result.stderr


def test_usage_errors_are_exit_2() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # never contacted: typer refuses first
    for args in (
        ["create", "x", "ticker", "--arg", "no-equals-sign"],
        ["create", "x", "ticker", "--args-json", "[1, 2]"],
        ["create", "x", "ticker", "--retry-json", "{oops"],
        ["create", "x", "ticker", "--isolation", "thread"],
        ["list", "--status", "Sleeping"],
        ["list", "--limit", "0"],
        ["stop"],
        ["nonsense"],
    ):
        result = cli(url, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
    assert cli("localhost:8000", "list").returncode == 2  # not a URL


def test_token(system: System) -> None:
    # /readyz stays public, so the harness sees the manager ready without a token.
    system.start_manager(ORCH_API_TOKENS="s3cret-token", ORCH_API_READ_TOKENS="reader-token")
    url = system.base_url

    anonymous = cli(url, "list")
    assert anonymous.returncode == 1
    assert "401" in anonymous.stderr and "--token" in anonymous.stderr and "ORCH_TOKEN" in anonymous.stderr

    wrong = cli(url, "list", token="not-the-token")
    assert wrong.returncode == 1 and "401" in wrong.stderr and "refused" in wrong.stderr

    assert cli(url, "list", token="s3cret-token").returncode == 0
    assert cli(url, "list", env={"ORCH_TOKEN": "s3cret-token"}).returncode == 0

    # A read-only token may list, not create
    assert cli(url, "stats", token="reader-token").returncode == 0
    read_only = cli(url, "create", "x", "ticker", token="reader-token")
    assert read_only.returncode == 1 and "403" in read_only.stderr


# What a client has no business loading: our server packages and their frameworks. `shared` is
# on the list too: the CLI needs none of its contracts today (it works on plain JSON).
SERVER_MODULES = {
    "manager",
    "observer_service",
    "shared",
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "asyncpg",
    "aio_pika",
    "aiormq",
    "jsonschema",
    "prometheus_client",
}

# Plays `pip install .` in this venv: every module named in argv[1] fails to import, as if it
# were not installed; then runs a command that goes through the HTTP client, to an address
# nobody listens on (argv[2]), and prints its exit code and the top-level modules loaded.
_BASE_INSTALL_RUN = """
import json, sys
absent = set(json.loads(sys.argv[1]))

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in absent:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the base install)", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
from cli.main import main
sys.argv = ["orchestrator", "--url", sys.argv[2], "create", "x", "ticker", "--arg", "a=1", "--isolation", "process"]
try:
    main()
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "modules": sorted({name.partition(".")[0] for name in sys.modules})}))
"""


def base_requirements_closure() -> set[str]:
    """Distributions that `pip install .` brings: this project and its base dependencies,
    transitively (read from pyproject.toml: the installed metadata may predate an edit)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    seen: set[str] = {canonicalize_name(project["name"])}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        for text in importlib.metadata.requires(name) or []:
            dep = Requirement(text)
            extras = ["", *sorted(req.extras)]  # "" = the dependency's own base requirements
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in extras):
                todo.append(dep)
    return seen


def test_the_cli_runs_on_the_base_dependencies_and_loads_no_server_module() -> None:
    closure = base_requirements_closure()
    assert not closure & {"fastapi", "sqlalchemy", "asyncpg", "aio-pika", "uvicorn"}, sorted(closure)
    # Top-level modules of every installed distribution outside the closure (httpx, for one,
    # imports click when it can: it must not need it), and our own server packages.
    absent = set(SERVER_MODULES)
    for module, dists in importlib.metadata.packages_distributions().items():
        if not {canonicalize_name(d) for d in dists} & closure:
            absent.add(module)
    url = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    command = [sys.executable, "-c", _BASE_INSTALL_RUN, json.dumps(sorted(absent)), url]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    run = json.loads(result.stdout.splitlines()[-1])
    assert run["code"] == 3 and url in result.stderr, result.stderr  # it got as far as the request
    loaded = set(run["modules"])
    assert "httpx" in loaded and not loaded & SERVER_MODULES, sorted(loaded & SERVER_MODULES)


def test_the_console_script_is_the_cli() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"orchestrator": "cli.main:main"}
    from cli.main import main

    assert callable(main)


def test_the_cli_copies_of_api_values_match_the_manager() -> None:
    # Importing the manager here is fine: this is the test process, not the CLI's.
    from cli import render
    from cli.main import Isolation, Sort, Status
    from manager.db.models import ObserverStatus, ServiceStatus
    from manager.db.observers import Sort as ApiSort
    from shared.messages import Isolation as ApiIsolation

    assert [s.value for s in Status] == [s.value for s in ObserverStatus] == list(render.OBSERVER_STATUSES)
    assert {s.value for s in Sort} == {s.value for s in ApiSort}
    assert {i.value for i in Isolation} == set(get_args(ApiIsolation))
    assert {s.value for s in (*ObserverStatus, *ServiceStatus)} <= set(render.STATUS_STYLES)
