"""``tools.infra.pg_series``: which PostgreSQL ``$ORCH_POSTGRES`` chooses, where each series
comes from, and an unknown series refused with a message that names the choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.infra import InfraError
from tools.infra.pg_series import DEFAULT_SERIES, SERIES_ENV_VAR, PgInstall, install_for, selected_series
from tools.infra.stack import pg_base


def test_the_default_is_the_hosts_15() -> None:
    assert DEFAULT_SERIES == "15"
    assert selected_series({}) == "15"
    assert selected_series({SERIES_ENV_VAR: ""}) == "15"  # `make ...` without POSTGRES= exports it empty


def test_17_is_chosen_by_the_variable() -> None:
    assert SERIES_ENV_VAR == "ORCH_POSTGRES"
    assert selected_series({SERIES_ENV_VAR: "17"}) == "17"
    assert selected_series({SERIES_ENV_VAR: " 17\n"}) == "17"


@pytest.mark.parametrize("value", ["16", "17.2", "latest", "pg17"])
def test_an_unknown_series_is_refused_naming_the_choices(value: str) -> None:
    with pytest.raises(InfraError) as refused:
        selected_series({SERIES_ENV_VAR: value})
    message = str(refused.value)
    assert repr(value) in message
    assert "ORCH_POSTGRES" in message and "POSTGRES=" in message
    assert "15, 17" in message


def test_15_runs_from_the_host_and_17_from_a_trixie_root_under_the_base(tmp_path: Path) -> None:
    host = install_for("15", tmp_path)
    assert host == PgInstall("15", None)
    assert host.bin_dir == Path("/usr/lib/postgresql/15/bin")
    newer = install_for("17", tmp_path)
    assert newer.root == tmp_path / "pg-roots" / "trixie"
    assert newer.bin_dir == Path("/usr/lib/postgresql/17/bin")
    assert not newer.present()
    # Each series keeps data of its own; 15's folder is the one used before there was a choice.
    assert pg_base(tmp_path, "15") == tmp_path / "postgres"
    assert pg_base(tmp_path, "17") == tmp_path / "postgres-17"


def test_a_roots_postgres_account_is_read_from_its_own_passwd(tmp_path: Path) -> None:
    etc = tmp_path / "pg-roots" / "trixie" / "etc"
    etc.mkdir(parents=True)
    (etc / "passwd").write_text(
        "root:x:0:0::/root:/bin/sh\npostgres:x:100:102:PostgreSQL:/var/lib/postgresql:/bin/sh\n"
    )
    install = install_for("17", tmp_path)
    assert install.ids() == (100, 102)
    argv = install.command(["psql", "-X"], binds=[tmp_path / "node"])
    assert argv[0] == "unshare" and argv[-2:] == ["psql", "-X"]
    assert "--userspec=100:102" in argv[6]
    assert str(tmp_path / "node") in argv
