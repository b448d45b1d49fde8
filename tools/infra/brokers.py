"""The RabbitMQ releases the project supports, each run from a real Debian package.

A Debian 12 machine packages RabbitMQ 3.10 only. Newer series come from newer Debian
releases, whose binaries need a newer glibc than the host's, so they run inside a root
made by ``debootstrap`` (a minimal Debian of that release with ``rabbitmq-server``
installed), in a mount namespace of their own: the node's folder is bound into the root
at the same path, so paths, pid files and logs read the same from either side, and the
mounts vanish with the process (nothing to unmount, nothing left behind by a ``kill -9``).

A root is made once per base folder (``<base>/brokers/<suite>/``) and reused by every
later ``up``: it is never upgraded behind the user's back. Debian unstable changes daily:
a made root keeps the version it was made with, and a day on which the suite will not
install (or has moved to another series) fails ``up`` with a message that says so and
names the way out, leaving any earlier root untouched (``destroy`` or deleting the folder
makes a new one).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.infra.packages import apt_install
from tools.infra.roots import in_root, make_root
from tools.infra.state import resolve_base
from tools.infra.system import InfraError, run

# The series ``make run`` and ``make test`` use unless told otherwise: what users install
# today (the newest release; the RabbitMQ Cluster Operator's default) is what we test first.
DEFAULT_SERIES = "4.3"
SERIES_ENV_VAR = "ORCH_RABBITMQ"
RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")


@dataclass(frozen=True)
class Release:
    """A supported series and where its package comes from."""

    series: str
    # The Debian suite whose package gives this series; None: the host's own package.
    suite: str | None


RELEASES: dict[str, Release] = {
    r.series: r
    for r in (
        Release("4.3", "sid"),  # the newest release, in Debian unstable
        Release("4.0", "trixie"),  # Debian 13's
        Release("3.10", None),  # Debian 12's, the host's own; out of upstream support
    )
}


def release(series: str) -> Release:
    try:
        return RELEASES[series]
    except KeyError:
        raise InfraError(f"RabbitMQ {series!r} is not supported here: choose one of {', '.join(RELEASES)}") from None


@dataclass(frozen=True)
class Install:
    """Where one series' binaries are: on the host (``root`` None) or inside a root."""

    series: str
    root: Path | None = None

    @property
    def server(self) -> Path:
        return RABBIT_BIN / "rabbitmq-server"

    @property
    def ctl(self) -> Path:
        return RABBIT_BIN / "rabbitmqctl"

    def present(self) -> bool:
        prefix = self.root if self.root is not None else Path("/")
        return (prefix / str(self.server).lstrip("/")).exists()

    def command(self, argv: Sequence[str], binds: Sequence[Path] = ()) -> list[str]:
        """``argv`` as run from the host: as it is, or inside the root with ``binds``
        (folders of the host) visible at the same paths."""
        if self.root is None:
            return list(argv)
        return in_root(self.root, argv, binds)

    def version(self) -> str:
        """The installed package's version (dpkg's database of the root or the host)."""
        admin = (self.root or Path("/")) / "var/lib/dpkg"
        out = run(["dpkg-query", "--admindir", str(admin), "-W", "-f", "${Version}", "rabbitmq-server"])
        return out.strip()


def roots_dir(base: Path) -> Path:
    return base / "brokers"


def install_for(series: str, base: Path) -> Install:
    """Where ``series`` is (or will be, once ``ensure_installed``) for the base folder."""
    suite = release(series).suite
    return Install(series, None if suite is None else roots_dir(base) / suite)


def selected_series() -> str:
    """``$ORCH_RABBITMQ`` (``make ... RABBITMQ=4.0`` sets it), else the default. Not sticky:
    a command that does not say which runs the default, as users' brokers do."""
    chosen = os.environ.get(SERIES_ENV_VAR) or DEFAULT_SERIES
    release(chosen)
    return chosen


def default_install() -> Install:
    """The selected series for the default base folder (what a node made without saying
    which RabbitMQ runs: the same as the project's own node)."""
    return install_for(selected_series(), resolve_base(None))


def ensure_installed(install: Install) -> None:
    """Install ``install``'s package if it is missing: ``apt-get`` on the host, or a new root
    by ``debootstrap`` (about a minute and 400 MB). Checks that what is there is the series
    asked for."""
    if install.root is None:
        if not install.present():
            apt_install(["rabbitmq-server"])
    elif not install.present():
        _make_root(install)
    version = install.version()
    if not version.startswith(install.series + "."):
        where = install.root or "the host"
        raise InfraError(
            f"RabbitMQ {install.series} was asked for, but {where} has rabbitmq-server {version}. "
            + (
                f"Debian's {release(install.series).suite} now ships another series: delete {install.root} to try "
                "again another day, or choose another series (RABBITMQ=...)."
                if install.root is not None
                else "Choose the series this host's package gives (RABBITMQ=...)."
            )
        )


def _make_root(install: Install) -> None:
    assert install.root is not None
    suite = release(install.series).suite
    assert suite is not None
    make_root(
        install.root,
        suite,
        ["rabbitmq-server"],
        f"RabbitMQ {install.series}",
        "choose another series with RABBITMQ=...",
    )
