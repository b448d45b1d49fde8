"""The observer kinds the live services offer (announced in ServiceBorn), and the validation
of a new observer against them: 422 with every field error before anything is queued.

Built-in kinds are validated with their own pydantic models (the manager ships them);
plug-in kinds with the JSON Schema their services announced (``jsonschema``), since the
manager need not have the plug-in installed. A service may also narrow a built-in's schema
to what it accepts (``periodic`` announces the modules its ``ORCH_PERIODIC_MODULES`` allows):
args must then satisfy every schema announced for the kind in the observer's pool, because
any service of the pool may take the start. A failing subschema's ``errorMessage`` (the
ajv-errors convention) replaces jsonschema's own message, so a service can say which of its
settings refused the value.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db import services
from manager.errors import Invalid, Unavailable
from shared.kinds import BUILTIN_KINDS
from shared.messages import KindInfo, RetryPolicy


@dataclass(frozen=True)
class NewObserver:
    name: str
    kind: str
    args: dict[str, Any]
    pool: str = "default"
    # Fields of the retry policy the request sets; the rest come from the settings.
    retry: dict[str, Any] | None = None
    isolation: str | None = None
    memory_limit_mb: float | None = None
    # The schedule (``manager/schedule.py``): already checked by the API's schema.
    start_at: datetime | None = None
    stop_at: datetime | None = None
    run_for_s: float | None = None
    rebalance: bool | None = None  # False: pinned, never moved to even the load; None: the kind's own


@dataclass
class OfferedKind:
    info: KindInfo
    pools: set[str] = field(default_factory=set)
    services: int = 0
    # Each distinct args schema announced (canonical JSON) -> the pools announcing it.
    schemas: dict[str, set[str]] = field(default_factory=dict)

    def announced_by(self, pools: list[str], info: KindInfo) -> None:
        """Count a live service of ``pools`` that announced this kind as ``info``."""
        self.pools.update(pools)
        self.services += 1
        self.schemas.setdefault(_canonical(info), set()).update(pools)

    def schemas_in(self, pool: str) -> list[str]:
        """The schemas (canonical JSON) that args must satisfy in ``pool``: those announced
        there, or the kind's own when none was recorded."""
        return [schema for schema, pools in self.schemas.items() if pool in pools] or [_canonical(self.info)]


@dataclass
class KindCatalog:
    kinds: dict[str, OfferedKind]
    pools: set[str]  # pools served by at least one live service

    @classmethod
    async def load(cls, session: AsyncSession) -> KindCatalog:
        kinds: dict[str, OfferedKind] = {}
        pools: set[str] = set()
        for service_pools, infos in await services.alive_offers(session):
            pools.update(service_pools)
            for raw in infos:
                info = KindInfo.model_validate(raw)
                kinds.setdefault(info.name, OfferedKind(info)).announced_by(service_pools, info)
        for name, kind in BUILTIN_KINDS.items():
            kinds.setdefault(name, OfferedKind(kind.info()))
        return cls(kinds, pools)


class CatalogCache:
    """The catalog, loaded at most once per ``ttl_s`` and by one load at a time.

    It changes only when a service is born or lost, and loading it (a query, and every
    live service's schemas parsed) is a large share of a single create's cost. Callers that
    find it stale while a load runs wait for that load rather than start one each (figures:
    docs/bench-history.md, "One kind-catalog load at a time").
    """

    def __init__(self, load: Callable[[], Awaitable[KindCatalog]], ttl_s: float = 1.0) -> None:
        self._load = load
        self._ttl_s = ttl_s
        self._cached: tuple[float, KindCatalog] | None = None  # (when its load began, catalog)
        self._loading: asyncio.Task[KindCatalog] | None = None

    async def get(self, fresh: bool = False) -> KindCatalog:
        """The cached catalog while it is younger than ``ttl_s``; ``fresh``: one whose load
        begins now (the cached one may predate a service just born)."""
        cached = self._cached
        if not fresh and cached is not None and time.monotonic() - cached[0] <= self._ttl_s:
            return cached[1]
        if fresh or self._loading is None:
            self._loading = asyncio.create_task(self._load_and_keep(time.monotonic()))
            # Its error is every waiting caller's; retrieved here too, in case none is left.
            self._loading.add_done_callback(lambda task: task.cancelled() or task.exception())
        # Shielded: a caller that goes away (its client disconnected) leaves the load to the others.
        return await asyncio.shield(self._loading)

    async def _load_and_keep(self, began: float) -> KindCatalog:
        try:
            catalog = await self._load()
            if self._cached is None or self._cached[0] < began:  # a later load may have ended first
                self._cached = (began, catalog)
            return catalog
        finally:
            if self._loading is asyncio.current_task():
                self._loading = None


def validate(spec: NewObserver, catalog: KindCatalog, default_retry: RetryPolicy, where: str = "") -> NewObserver:
    """The spec with its args normalised and its full retry policy; raises ``Invalid``
    (422) with every problem, or ``Unavailable`` (503) when no live service serves the pool."""
    if spec.pool not in catalog.pools:
        raise Unavailable(f"no live observer service serves pool {spec.pool!r}; start one or use another pool")
    offered = catalog.kinds.get(spec.kind)
    if offered is None:
        raise Invalid(
            f"{where}kind: unknown observer kind {spec.kind!r}; known kinds: {', '.join(sorted(catalog.kinds))}"
        )
    if spec.kind not in BUILTIN_KINDS and spec.pool not in offered.pools:
        raise Invalid(
            f"{where}kind: no live service of pool {spec.pool!r} offers kind {spec.kind!r} "
            f"(offered in: {', '.join(sorted(offered.pools))})"
        )
    args = _valid_args(spec, offered, where)
    retry = _valid_retry(spec.retry, default_retry, where)
    isolation = spec.isolation or offered.info.isolation
    if spec.memory_limit_mb is not None and isolation != "process":
        raise Invalid(f"{where}memory_limit_mb: applies to isolation 'process' only; set isolation to 'process'")
    rebalance = offered.info.rebalance if spec.rebalance is None else spec.rebalance
    return replace(spec, args=args, retry=retry.model_dump(mode="json"), rebalance=rebalance)


def _valid_args(spec: NewObserver, offered: OfferedKind, where: str) -> dict[str, Any]:
    schemas = offered.schemas_in(spec.pool)
    args = spec.args
    builtin = BUILTIN_KINDS.get(spec.kind)
    if builtin is not None:
        try:
            args = builtin.parse_args(spec.args).model_dump(mode="json")
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'args'}: {err['msg']}" for err in e.errors())
            raise Invalid(f"{where}args invalid for kind {spec.kind!r}: {problems}") from e
        # The model said it all unless a service narrowed the schema; skipping the identical
        # schema keeps jsonschema off the path of bulk creates of tickers.
        schemas = [schema for schema in schemas if schema != _BUILTIN_SCHEMAS[spec.kind]]
    found = dict.fromkeys(problem for schema in schemas for problem in _schema_problems(schema, args))
    if found:
        raise Invalid(f"{where}args invalid for kind {spec.kind!r}: {'; '.join(found)}")
    return args


def _schema_problems(schema_json: str, args: dict[str, Any]) -> list[str]:
    problems = []
    for error in sorted(_validator(schema_json).iter_errors(args), key=str):
        where = ".".join(map(str, error.absolute_path)) or "args"
        hint = error.schema.get("errorMessage") if isinstance(error.schema, dict) else None
        if isinstance(hint, str):
            problems.append(f"{where}: {hint} (got {error.instance!r})")
        else:
            problems.append(f"{where}: {error.message}")
    return problems


def _canonical(info: KindInfo) -> str:
    return json.dumps(info.args_schema, sort_keys=True)


# Computed once: comparing against them happens on every create.
_BUILTIN_SCHEMAS = {name: _canonical(kind.info()) for name, kind in BUILTIN_KINDS.items()}


def _valid_retry(override: dict[str, Any] | None, default: RetryPolicy, where: str) -> RetryPolicy:
    try:
        return RetryPolicy.model_validate(default.model_dump() | (override or {}))
    except ValidationError as e:
        problems = "; ".join(f"retry.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise Invalid(f"{where}{problems}") from e


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(schema_json))
