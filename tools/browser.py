"""Debian's ``chromium`` for the dashboard's browser test, installed when missing.

The test drives it with the Python ``playwright`` package (``executable_path=/usr/bin/chromium``);
``playwright install`` is never used: it downloads a browser, which these machines cannot.
Standard library only, like ``tools.infra``.

CLI::

    python -m tools.browser        # install chromium if missing, print its path

Installing is idempotent and serialised by a machine-wide file lock (the package is
machine-wide too), so parallel test sessions wait for one ``apt-get`` instead of racing on
dpkg's lock. ``apt-get update`` runs only when the install with the current lists fails
(stale lists name .debs the mirror no longer has).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from tools.infra import InfraError, no_service_starts, run

__all__ = ["CHROMIUM", "LAUNCH_ARGS", "BrowserError", "CannotInstall", "ensure_chromium", "main"]

CHROMIUM = Path("/usr/bin/chromium")
PACKAGE = "chromium"
# What ENVIRONMENT.md checked for a headless chromium run as root with no network.
LAUNCH_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
LOCK_ENV_VAR = "ORCH_BROWSER_LOCK"
# apt waits this long for dpkg's own lock (another apt run, e.g. tools.infra's) instead of failing.
_DPKG_LOCK_WAIT_S = 600

_print_lock = threading.Lock()


class BrowserError(InfraError):
    """chromium is missing and could not be installed."""


class CannotInstall(BrowserError):
    """chromium is missing and this machine offers no way to install it (no apt-get, not root);
    unlike a failed ``apt-get``, a reason for a test to skip rather than fail."""


def _log(message: str) -> None:
    with _print_lock:
        print(f"[browser] {message}", file=sys.stderr, flush=True)


def _lock_path() -> Path:
    """Machine-wide (the package is): /run/lock when writable, else the temp folder."""
    configured = os.environ.get(LOCK_ENV_VAR)
    if configured:
        return Path(configured)
    run_lock = Path("/run/lock")
    folder = run_lock if run_lock.is_dir() and os.access(run_lock, os.W_OK) else Path(tempfile.gettempdir())
    return folder / "orch-chromium-install.lock"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _apt_install(env: Mapping[str, str]) -> None:
    install = ["apt-get", "-o", f"DPkg::Lock::Timeout={_DPKG_LOCK_WAIT_S}", "install", "-y", PACKAGE]
    _log(shlex.join(install))
    try:
        run(install, env=env, timeout=1800)
        return
    except InfraError as exc:
        # Usually stale package lists (404 on a .deb the mirror replaced): refresh, try again.
        _log(f"install failed; running apt-get update and retrying ({str(exc).splitlines()[0]})")
    run(["apt-get", "-o", f"DPkg::Lock::Timeout={_DPKG_LOCK_WAIT_S}", "update"], env=env, timeout=900)
    run(install, env=env, timeout=1800)


def _check(path: Path) -> str:
    """The browser's version line; raises when the binary does not run."""
    return run([str(path), "--headless", "--no-sandbox", "--version"], timeout=60).strip()


def ensure_chromium(path: Path = CHROMIUM) -> Path:
    """Return ``path`` (Debian's chromium), installing the ``chromium`` package if missing.

    Raises CannotInstall when it is missing and the machine has no apt-get or this is not root,
    InfraError when apt-get failed; the message says why.
    """
    if path.exists():
        return path
    if shutil.which("apt-get") is None:
        raise CannotInstall(f"{path} is missing and there is no apt-get to install {PACKAGE!r}")
    if os.geteuid() != 0:
        raise CannotInstall(f"{path} is missing: run as root to apt-get install {PACKAGE!r}")
    with _locked(_lock_path()):
        if path.exists():  # another run installed it while we waited for the lock
            _log(f"{path} installed meanwhile by another run")
            return path
        began = time.monotonic()
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        with no_service_starts():
            _apt_install(env)
        if not path.exists():
            raise BrowserError(f"apt-get installed {PACKAGE!r} but {path} does not exist")
        _log(f"installed {_check(path)} in {time.monotonic() - began:.1f}s")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.browser",
        description="Install Debian's chromium (for the dashboard test) if missing; print its path.",
    )
    parser.parse_args(argv)
    try:
        print(ensure_chromium())
    except InfraError as exc:
        print(f"[browser] error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
