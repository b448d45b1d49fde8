"""tools.infra.brokers: each supported RabbitMQ series from Debian's package, chosen by name.

A newer series runs inside a Debian root of its release, in a private mount namespace where
the node's folder is bound at the same path. These tests use the root of the series the
session's broker runs (the host itself for 3.10)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tools import infra
from tools.infra import brokers


def test_an_unknown_series_is_refused_naming_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(brokers.SERIES_ENV_VAR, "3.13")
    with pytest.raises(infra.InfraError, match=r"RabbitMQ '3.13' is not supported here: choose one of 4.3, 4.0, 3.10"):
        brokers.selected_series()


def test_the_default_series_is_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(brokers.SERIES_ENV_VAR, raising=False)
    assert brokers.selected_series() == brokers.DEFAULT_SERIES == "4.3"
    assert brokers.RELEASES["4.3"].suite == "sid" and brokers.RELEASES["3.10"].suite is None


def test_a_bound_folder_reads_the_same_inside_the_root(rabbit: infra.RabbitNode, tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    note.write_text("same path on both sides\n")
    install = rabbit.install
    argv = install.command(["cat", str(note)], [tmp_path])
    assert subprocess.run(argv, capture_output=True, text=True, check=True).stdout == "same path on both sides\n"
    if install.root is not None:
        # Inside is the root's own Debian, and nothing stays mounted on the host afterwards
        release = subprocess.run(install.command(["cat", "/etc/debian_version"]), capture_output=True, text=True)
        assert release.stdout != Path("/etc/debian_version").read_text()
        with open("/proc/self/mounts") as mounts:
            assert str(install.root) not in mounts.read()


def test_the_running_broker_is_the_series_asked_for(rabbit: infra.RabbitNode) -> None:
    version = rabbit.ctl("eval", "rabbit_misc:version().").strip().strip('"')
    assert version.startswith(rabbit.install.series + "."), version
    assert rabbit.install.version().startswith(version)
    assert rabbit.install.series == (os.environ.get(brokers.SERIES_ENV_VAR) or brokers.DEFAULT_SERIES)


def test_a_root_of_another_series_is_named_not_used(rabbit: infra.RabbitNode) -> None:
    # Debian unstable moved on (here: a root that holds another series than the one asked for)
    if rabbit.install.root is None:
        pytest.skip("the host's own package: no root")
    other = next(s for s in brokers.RELEASES if s != rabbit.install.series)
    with pytest.raises(infra.InfraError) as refused:
        brokers.ensure_installed(brokers.Install(other, rabbit.install.root))
    said, root, series = str(refused.value), rabbit.install.root, rabbit.install.series
    assert f"RabbitMQ {other} was asked for, but {root} has rabbitmq-server {series}." in said
    assert "now ships another series" in said and "RABBITMQ=" in said
