"""Debian roots of a newer release, made by ``debootstrap``, and commands run inside them.

Packages of a newer Debian release (RabbitMQ 4.x: ``brokers``; PostgreSQL 17: ``pg_series``)
need a newer glibc than the host's, so they run inside a minimal root of that release, in a
mount namespace of their own: the folders they work in are bound into the root at the same
paths, so paths, pid files and logs read the same from either side, and the mounts vanish
with the process (nothing to unmount, nothing left behind by a ``kill -9``).

A root is made once and reused: never upgraded behind the user's back. Made aside
(``<root>.partial``) and renamed when complete, so an interrupted build is never taken for
a root.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from tools.infra.packages import apt_install
from tools.infra.system import InfraError, log, run


def in_root(
    root: Path, argv: Sequence[str], binds: Sequence[Path] = (), user: tuple[int, int] | None = None
) -> list[str]:
    """``argv`` run inside ``root`` with ``binds`` (folders of the host) visible at the same
    paths, as root or as ``user`` (uid, gid of the root's own accounts)."""
    for folder in binds:
        (root / str(folder).lstrip("/")).mkdir(parents=True, exist_ok=True)
    mounts = " && ".join(
        [f'mount --bind "${i + 2}" "$1${i + 2}"' for i in range(len(binds))]
        + ['mount -t proc proc "$1/proc"', 'mount --rbind /dev "$1/dev"']
    )
    spec = [] if user is None else [f"--userspec={user[0]}:{user[1]}", f"--groups={user[1]}"]
    script = f'{mounts} || exit 97; root=$1; shift {len(binds) + 1}; exec chroot {" ".join(spec)} "$root" "$@"'
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        str(root),
        *(str(b) for b in binds),
        *argv,
    ]


def make_root(root: Path, suite: str, packages: Sequence[str], what: str, way_out: str) -> None:
    """``debootstrap --variant=minbase --include=packages suite`` into ``root`` (``what``
    names it in messages; ``way_out`` is what to do when the suite will not install)."""
    if shutil.which("debootstrap") is None:
        apt_install(["debootstrap"])
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    log(f"making a Debian {suite} root with {', '.join(packages)} for {what} in {root} (~1 min)")
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(partial)]
    if mirror := os.environ.get("ORCH_DEBIAN_MIRROR"):
        argv.append(mirror)
    try:
        run(argv, timeout=1800)
    except InfraError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise InfraError(
            f"could not make a Debian {suite} root for {what} (Debian {suite}'s packages may not install today; "
            f"try again later, or {way_out}): {exc}"
        ) from exc
    # Erlang resolves the node's host name; a minimal root has no /etc/hosts.
    (partial / "etc" / "hosts").write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost\n")
    partial.rename(root)
    log(f"made {root} in {time.monotonic() - began:.0f}s")
