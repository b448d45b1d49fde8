"""The PostgreSQL releases the project is tested on, each from a real Debian package.

``$ORCH_POSTGRES`` (``make ... POSTGRES=17``) chooses: 15, the default, is the host's own
Debian 12 package, run as the host's ``postgres`` user; 17 is Debian 13 (trixie)'s
``postgresql-17``, whose binaries need a newer glibc than the host's, so it runs inside a
root of its own made by ``debootstrap`` (``roots``; ``<base>/pg-roots/trixie/``, made once
and reused), as that root's ``postgres`` user, with the node's folder bound in at the same
path. A root of its own rather than RabbitMQ 4.0's trixie root: that one holds exactly what
its ``debootstrap`` made for the broker (deleting it to retry another day loses nothing
else), and adding a package to it would mean running apt inside a root a node may be
running from.
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.infra.packages import apt_install
from tools.infra.roots import in_root, make_root
from tools.infra.state import resolve_base
from tools.infra.system import InfraError, run

DEFAULT_SERIES = "15"
SERIES_ENV_VAR = "ORCH_POSTGRES"
PG_OS_USER = "postgres"
# A fixed PATH for commands run as the postgres user: the caller's may name a venv or worse.
SYS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# series -> the Debian suite whose postgresql-<series> gives it; None: the host's own package.
RELEASES: dict[str, str | None] = {"15": None, "17": "trixie"}


def suite_of(series: str) -> str | None:
    try:
        return RELEASES[series]
    except KeyError:
        raise InfraError(
            f"PostgreSQL {series!r} is not supported here (${SERIES_ENV_VAR}, make ... POSTGRES=): "
            f"choose one of {', '.join(RELEASES)}"
        ) from None


def selected_series(environ: Mapping[str, str] | None = None) -> str:
    """``$ORCH_POSTGRES`` (``make ... POSTGRES=17`` sets it), else the default; not sticky."""
    env = os.environ if environ is None else environ
    chosen = (env.get(SERIES_ENV_VAR) or DEFAULT_SERIES).strip()
    suite_of(chosen)
    return chosen


def _passwd_ids(passwd: Path) -> tuple[int, int]:
    """The postgres account of a root's /etc/passwd."""
    for line in passwd.read_text().splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and fields[0] == PG_OS_USER:
            return int(fields[2]), int(fields[3])
    raise InfraError(f"no '{PG_OS_USER}' account in {passwd}")


@dataclass(frozen=True)
class PgInstall:
    """Where one series' binaries are: on the host (``root`` None) or inside a root."""

    series: str
    root: Path | None = None

    @property
    def bin_dir(self) -> Path:
        return Path("/usr/lib/postgresql") / self.series / "bin"

    def present(self) -> bool:
        prefix = self.root if self.root is not None else Path("/")
        return (prefix / str(self.bin_dir / "postgres").lstrip("/")).exists()

    def ids(self) -> tuple[int, int]:
        """uid, gid of the postgres account that owns the data (the root's own, in a root)."""
        if self.root is not None:
            return _passwd_ids(self.root / "etc" / "passwd")
        try:
            entry = pwd.getpwnam(PG_OS_USER)
        except KeyError as exc:
            raise InfraError(f"no '{PG_OS_USER}' OS user: install postgresql") from exc
        return entry.pw_uid, entry.pw_gid

    def command(self, argv: Sequence[str], binds: Sequence[Path] = ()) -> list[str]:
        """``argv`` run as the postgres account: ``runuser`` on the host, or inside the root
        with ``binds`` (folders of the host) visible at the same paths."""
        uid, gid = self.ids()
        if self.root is not None:
            if os.geteuid() != 0:
                raise InfraError(f"PostgreSQL {self.series} runs in a chroot: run as root")
            return in_root(self.root, argv, binds, user=(uid, gid))
        if os.geteuid() == uid:
            return list(argv)
        if os.geteuid() != 0:
            raise InfraError(f"PostgreSQL must be run as root or {PG_OS_USER}")
        runuser = shutil.which("runuser", path=SYS_PATH) or "/usr/sbin/runuser"
        return [runuser, "-u", PG_OS_USER, "--", *argv]

    def version(self) -> str:
        admin = (self.root or Path("/")) / "var/lib/dpkg"
        out = run(["dpkg-query", "--admindir", str(admin), "-W", "-f", "${Version}", f"postgresql-{self.series}"])
        return out.strip()


def roots_dir(base: Path) -> Path:
    return base / "pg-roots"


def install_for(series: str, base: Path) -> PgInstall:
    suite = suite_of(series)
    return PgInstall(series, None if suite is None else roots_dir(base) / suite)


def default_install() -> PgInstall:
    """The selected series for the default base folder (a node made without saying which)."""
    return install_for(selected_series(), resolve_base(None))


def ensure_installed(install: PgInstall) -> None:
    """Install ``install``'s package if missing: ``apt-get`` on the host, or a new root."""
    if install.present():
        return
    if install.root is None:
        apt_install([f"postgresql-{install.series}"])
        if not install.present():
            raise InfraError(f"postgresql-{install.series} installed but {install.bin_dir} has no postgres")
        return
    suite = suite_of(install.series)
    assert suite is not None
    make_root(
        install.root,
        suite,
        [f"postgresql-{install.series}"],
        f"PostgreSQL {install.series}",
        "choose another series with POSTGRES=...",
    )
