"""promtool, from Debian's ``prometheus`` package, for the checks of ``deploy/prometheus/``
(``make alerts-check``, ``tests/system/test_alerts.py``).

Only the binary is wanted, never the Prometheus server or its system service: the package is
downloaded (``apt-get download``, no root needed once the lists are there) and unpacked under
``<base>/promtool/`` (``dpkg-deb -x``), then reused by every later call. Unpacked aside and
renamed when complete, so an interrupted unpack is never taken for a tool.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from pathlib import Path

from tools.infra.state import resolve_base
from tools.infra.system import InfraError, log, run

PACKAGE = "prometheus"


def promtool_path(base: Path | None = None) -> Path:
    return resolve_base(base) / "promtool" / "usr" / "bin" / "promtool"


def ensure_promtool(base: Path | None = None) -> Path:
    """The path of a working promtool, unpacked on first use (about 20 MB, seconds)."""
    binary = promtool_path(base)
    if binary.exists():
        return binary
    folder = binary.parents[2]
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".promtool-") as tmp:
        os.chmod(tmp, 0o755)  # apt's download user must be able to write there
        _download(Path(tmp))
        [deb] = glob.glob(os.path.join(tmp, f"{PACKAGE}_*.deb"))
        partial = Path(tmp) / "root"
        run(["dpkg-deb", "-x", deb, str(partial)])
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    version = run([str(binary), "--version"]).splitlines()[0]
    log(f"promtool unpacked in {folder}: {version}")
    return binary


def _download(into: Path) -> None:
    log(f"apt-get download {PACKAGE} (for promtool)")
    try:
        run(["apt-get", "download", PACKAGE], cwd=into, timeout=600)
        return
    except InfraError as exc:
        if os.geteuid() != 0:
            raise InfraError(f"cannot download Debian's {PACKAGE} package (run as root to update apt): {exc}") from exc
        log(f"apt-get download failed; updating the package lists ({exc})")
    run(["apt-get", "update"], env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, timeout=900)
    run(["apt-get", "download", PACKAGE], cwd=into, timeout=600)
