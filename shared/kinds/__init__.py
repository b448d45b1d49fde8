"""Observer kinds that ship with the project. Third-party kinds come from plug-ins."""

from __future__ import annotations

from typing import Any

from shared.kinds import ticker
from shared.observer_api import ObserverKind

BUILTIN_KINDS: dict[str, ObserverKind[Any]] = {k.name: k for k in (ticker.KIND,)}


def available_kinds() -> dict[str, ObserverKind[Any]]:
    """Every kind this host can run (built-ins for now; entry points come with plug-ins)."""
    return dict(BUILTIN_KINDS)
