"""The observer kinds a service can run: the built-ins plus every kind published by an installed
plug-in in the entry-point group ``orchestrator.observers``.

Each kind is known with its *reference* (``module:attribute``), so a child process
(``isolation = "process"``) can import the very same object.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from shared.observer_api import ObserverKind

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "orchestrator.observers"

BUILTIN_REFS = (
    "shared.kinds.ticker:KIND",
    "shared.kinds.http_poll:KIND",
    "shared.kinds.websocket:KIND",
    "shared.kinds.periodic:KIND",
    "shared.kinds.idle:KIND",
)


@dataclass(frozen=True)
class LoadedKind:
    kind: ObserverKind[Any]
    ref: str  # "module:attribute"


def load_ref(ref: str) -> ObserverKind[Any]:
    """Import ``module:attribute`` and check that it is an ``ObserverKind``."""
    module_name, _, attribute = ref.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"kind reference {ref!r} is not of the form 'module:attribute'")
    obj = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, ObserverKind):
        raise TypeError(f"{ref} is a {type(obj).__name__}, not an ObserverKind")
    return obj


def _builtins() -> dict[str, LoadedKind]:
    loaded = {}
    for ref in BUILTIN_REFS:
        kind = load_ref(ref)
        loaded[kind.name] = LoadedKind(kind, ref)
    return loaded


BUILTIN_KINDS: dict[str, ObserverKind[Any]]  # name -> kind; no value here: see __getattr__


def __getattr__(name: str) -> Any:
    """``BUILTIN_KINDS`` (name -> kind), built on first use. Built at import it would cost
    every importer of a kind module (``observer_service.settings`` imports ``shared.kinds.periodic``)
    httpx, websockets, click, rich and pygments, time a catching-up manager spends before it
    applies the first report (docs/design.md, "Where the time goes")."""
    if name == "BUILTIN_KINDS":
        kinds = {name: loaded.kind for name, loaded in _builtins().items()}
        globals()["BUILTIN_KINDS"] = kinds
        return kinds
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def discover_kinds() -> dict[str, LoadedKind]:
    """Built-ins plus plug-ins. A plug-in that fails to load, or that reuses a name already
    taken, is logged and skipped: one broken package must not stop the service."""
    kinds = _builtins()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            kind = load_ref(ep.value)
        except Exception:
            logger.exception("observer plug-in %r (%s) failed to load; skipping it", ep.name, ep.value)
            continue
        if kind.name in kinds:
            logger.error(
                "observer plug-in %s names its kind %r, which %s already provides; skipping it",
                ep.value,
                kind.name,
                kinds[kind.name].ref,
            )
            continue
        if kind.name != ep.name:
            logger.warning("entry point %r loads a kind named %r; the kind's own name counts", ep.name, kind.name)
        kinds[kind.name] = LoadedKind(kind, ep.value)
        logger.info("observer plug-in loaded: %s from %s", kind.name, ep.value)
    return kinds
