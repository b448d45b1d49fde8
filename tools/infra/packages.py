"""Debian packages of the host: where PostgreSQL's binaries are, and installing packages
(``apt-get``) when missing without letting them start their system services."""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator
from pathlib import Path

from tools.infra.system import InfraError, log, run


def pg_bin_dir() -> Path | None:
    """Newest /usr/lib/postgresql/<version>/bin holding a ``postgres`` binary."""
    found: list[tuple[int, Path]] = []
    for candidate in glob.glob("/usr/lib/postgresql/*/bin/postgres"):
        version = Path(candidate).parent.parent.name
        if version.isdigit():
            found.append((int(version), Path(candidate).parent))
    return max(found)[1] if found else None


@contextlib.contextmanager
def no_service_starts() -> Iterator[None]:
    """A temporary ``/usr/sbin/policy-rc.d`` (exit 101): packages installed meanwhile must not
    start their system services on these machines (we run our own servers on our own ports)."""
    policy = Path("/usr/sbin/policy-rc.d")
    own_policy = not policy.exists()
    if own_policy:
        policy.write_text("#!/bin/sh\n# tools: do not start services while installing\nexit 101\n")
        policy.chmod(0o755)
    try:
        yield
    finally:
        if own_policy:
            policy.unlink(missing_ok=True)


def ensure_packages() -> None:
    """apt-get install postgresql when missing (RabbitMQ: ``brokers.ensure_installed``)."""
    if pg_bin_dir() is None:
        apt_install(["postgresql"])
        if pg_bin_dir() is None:
            raise InfraError("postgresql installed but its binaries not found")


def apt_install(names: list[str]) -> None:
    """``apt-get install -y names`` without starting their system services.

    Runs ``apt-get update`` first. A temporary ``/usr/sbin/policy-rc.d`` (exit 101) stops the
    packages' maintainer scripts from starting their system services; if a system epmd or
    broker starts anyway, ours still uses its own node name and ports.
    """
    if os.geteuid() != 0:
        raise InfraError(f"missing packages {' '.join(names)}: run as root (apt-get install)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with no_service_starts():
        log("apt-get update")
        try:
            run(["apt-get", "update"], env=env, timeout=900)
        except InfraError as exc:
            log(f"warning: apt-get update failed; trying the cached package lists ({exc})")
        log(f"apt-get install -y {' '.join(names)}")
        run(["apt-get", "install", "-y", *names], env=env, timeout=1800)
    log(f"installed {' '.join(names)} (system services not started)")
