"""What one base folder (default ``<repo>/.run``) keeps between runs: the ports chosen once and
the generated passwords (``infra.json``), the ``env`` file other processes source, and the
lock that serialises ``up`` / ``down`` on it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.infra.system import LOOPBACK, InfraError, log, port_is_free, write_private

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BASE = REPO / ".run"
BASE_ENV_VAR = "ORCH_INFRA_BASE"

DEFAULT_AMQP_PORT = 5682
DEFAULT_DIST_PORT = 25682
DEFAULT_PG_PORT = 5442
DEFAULT_USER = "orch"


def new_password() -> str:
    return secrets.token_urlsafe(24)


def resolve_base(base: Path | None) -> Path:
    if base is None:
        base = Path(os.environ.get(BASE_ENV_VAR) or DEFAULT_BASE)
    return base.absolute()


# --------------------------------------------------------------------------- infra.json


def load_state(base: Path) -> dict[str, dict[str, Any]]:
    try:
        raw: object = json.loads((base / "infra.json").read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InfraError(f"cannot read {base / 'infra.json'}: {exc}") from exc
    if not isinstance(raw, dict):
        raise InfraError(f"{base / 'infra.json'} is not a JSON object")
    return {str(k): v for k, v in raw.items() if isinstance(v, dict)}


def save_state(base: Path, state: Mapping[str, Mapping[str, Any]]) -> None:
    write_private(base / "infra.json", json.dumps(state, indent=2, sort_keys=True) + "\n")


def int_field(section: Mapping[str, Any], key: str, default: int) -> int:
    value = section.get(key, default)
    return value if isinstance(value, int) else default


def str_field(section: Mapping[str, Any], key: str, default: str) -> str:
    value = section.get(key)
    return value if isinstance(value, str) and value else default


@contextlib.contextmanager
def locked(base: Path) -> Iterator[None]:
    base.mkdir(parents=True, exist_ok=True)
    with (base / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- ports


def pick_port(preferred: int, taken: set[int], span: int = 200) -> int:
    for port in range(preferred, min(preferred + span, 65536)):
        if port not in taken and port_is_free(port):
            return port
    raise InfraError(f"no free TCP port on {LOOPBACK} in {preferred}..{preferred + span - 1}")


def move_port(port: int, taken: set[int], what: str) -> int:
    """``port`` if free, else the next free one (another checkout's servers may hold it)."""
    chosen = pick_port(port, taken)
    if chosen != port:
        log(f"{what} port {port} is busy (not ours); using {chosen}")
    return chosen


# --------------------------------------------------------------------------- env


def env_file(base: Path) -> Path:
    return base / "env"


def write_env(base: Path, lines: Sequence[str]) -> None:
    write_private(env_file(base), "\n".join(lines) + "\n")
