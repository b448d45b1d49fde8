"""The Debian packages the servers come from: where their binaries are, and installing them
(``apt-get``) when missing without letting them start their system services."""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterator
from pathlib import Path

from tools.infra.system import InfraError, log, run

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
RABBIT_SERVER = RABBIT_BIN / "rabbitmq-server"
RABBITMQCTL = RABBIT_BIN / "rabbitmqctl"


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
    """apt-get install rabbitmq-server / postgresql when missing, without starting services.

    Runs ``apt-get update`` only when something must be installed. A temporary
    ``/usr/sbin/policy-rc.d`` (exit 101) stops the packages' maintainer scripts from starting
    their system services; if a system epmd/broker starts anyway, ours still uses its own node
    name and ports.
    """
    missing: list[str] = []
    if not RABBIT_SERVER.exists():
        missing.append("rabbitmq-server")
    if pg_bin_dir() is None:
        missing.append("postgresql")
    if not missing:
        log("packages present: rabbitmq-server, postgresql")
        return
    if os.geteuid() != 0:
        raise InfraError(f"missing packages {' '.join(missing)}: run as root (apt-get install)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with no_service_starts():
        log("apt-get update")
        try:
            run(["apt-get", "update"], env=env, timeout=900)
        except InfraError as exc:
            log(f"warning: apt-get update failed; trying the cached package lists ({exc})")
        log(f"apt-get install -y {' '.join(missing)}")
        run(["apt-get", "install", "-y", *missing], env=env, timeout=1800)
    if not RABBIT_SERVER.exists() or pg_bin_dir() is None:
        raise InfraError("packages installed but binaries not found")
    log(f"installed {' '.join(missing)} (system services not started)")
