"""``periodic``: calls a user function every ``interval_s``, cluster-wide exactly once.

The orchestrator runs one copy of an observer (one start message held by one service), so a
``periodic`` observer is a distributed cron with failover in seconds. The calls never
overlap: the next starts only after the previous one ended. They follow a fixed grid
``start + k * interval_s``; slots missed by a long call are skipped, never made up.

The function is ``"module.path:function"``, imported in the service process. It is called as
``await f(ctx, **kwargs)`` when it is ``async def`` (preferred), else ``f(ctx, **kwargs)`` in a
worker thread. Its return value (or ``repr`` of it, if not JSON) is emitted. The kind checks
the lease before each call; a long call should itself call ``ctx.ensure_lease()`` before each
side effect (and, in a thread, use nothing else of ``ctx`` but its plain attributes).

Timeouts: an ``async`` call is cancelled after ``timeout_s`` (a hard limit). A thread cannot
be killed: a sync call still running after ``timeout_s`` makes the observer raise at once (the
retry policy restarts it) while the thread runs on in the background, outside the no-overlap
guarantee (so does a thread caught by a stop or a handoff). The limit is only truly hard for
sync functions under ``isolation: process``, where the child process that runs the observer
is killed. With ``async`` isolation, sync functions also share the service's default thread
pool: prefer ``async def``.

Security: whoever may create observers chooses the function and its keyword arguments, so a
service calls only functions *defined* in the modules its operator lists in
``ORCH_PERIODIC_MODULES`` (comma-separated module or package names, e.g.
``myjobs,reports.tasks``: ``myjobs`` allows ``myjobs`` and ``myjobs.*``). Unset or empty, it
calls none. The service announces its list in the kind's args schema, so the manager answers
a function outside it with a 422 at create; the service checks again before importing
anything (defense in depth: a start message may come from elsewhere than the manager).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import math
import os
import re
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from shared.errors import LeaseLost
from shared.observer_api import ObserverContext, ObserverKind

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE = rf"{_IDENTIFIER}(\.{_IDENTIFIER})*"
FUNCTION_PATTERN = rf"^{_MODULE}:{_IDENTIFIER}$"
ALLOWED_MODULES_ENV = "ORCH_PERIODIC_MODULES"
_MAX_REPR_CHARS = 2000


class PeriodicError(Exception):
    """The function cannot be loaded, or failed ``max_consecutive_errors`` times in a row."""


class PeriodicArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    function: str = Field(
        pattern=FUNCTION_PATTERN,
        description="'module.path:function' importable on the services; called as "
        "await f(ctx, **kwargs) if async, else f(ctx, **kwargs) in a thread",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments (JSON) for each call")
    interval_s: float = Field(
        default=60.0, gt=0, le=86_400, description="calls start on the grid start + k * interval_s; missed slots skip"
    )
    timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=86_400,
        description="limit of one call: an async call is cancelled; a sync call (a thread cannot be killed) "
        "makes the observer raise, a hard limit only with isolation 'process'",
    )
    max_consecutive_errors: int = Field(
        default=3, ge=1, le=1_000_000, description="calls in a row that raise or time out before the observer raises"
    )
    emit_results: bool = Field(
        default=True, description="emit {call, duration_s, result} (or {call, duration_s, error}) after each call"
    )


def next_slot(origin: float, interval: float, last: int, now: float) -> int:
    """Index ``k > last`` of the first grid point ``origin + k * interval`` not before ``now``:
    slots that passed while the previous call ran are skipped, not made up."""
    return max(last + 1, math.ceil((now - origin) / interval))


def parse_modules(raw: str) -> tuple[str, ...]:
    """``ORCH_PERIODIC_MODULES`` as module names: comma-separated, blanks ignored, a trailing
    dot tolerated (``myjobs.`` = ``myjobs``); ``ValueError`` for anything that is not a
    dotted module name, so a typo stops the service at start instead of refusing quietly."""
    names = tuple(dict.fromkeys(p.strip().removesuffix(".") for p in raw.split(",") if p.strip()))
    bad = [n for n in names if not re.fullmatch(_MODULE, n)]
    if bad:
        raise ValueError(f"{ALLOWED_MODULES_ENV}: not module names: {', '.join(map(repr, bad))}")
    return names


def allowed_modules() -> tuple[str, ...]:
    """This process's allow list (read at each call: a start or the announcement)."""
    return parse_modules(os.environ.get(ALLOWED_MODULES_ENV, ""))


def module_allowed(module: str, allowed: tuple[str, ...]) -> bool:
    """``module`` is one of ``allowed`` or inside one of them (a package boundary: ``myjobs``
    allows ``myjobs.daily`` but not ``myjobs_evil``)."""
    return any(module == a or module.startswith(a + ".") for a in allowed)


def refusal(allowed: tuple[str, ...]) -> str:
    """Why a function outside ``allowed`` is refused, naming what the operator can change."""
    if not allowed:
        return (
            f"this service calls no function: {ALLOWED_MODULES_ENV} is unset; its operator may "
            "list the modules periodic may call (comma-separated module or package names)"
        )
    return f"only functions defined in the modules of {ALLOWED_MODULES_ENV} may be called: {', '.join(allowed)}"


def announce(schema: dict[str, Any]) -> dict[str, Any]:
    """The args schema narrowed to this service's allow list: ``function`` must match a
    pattern built from it (one that matches nothing when the list is empty), with the
    reason the manager shows in its 422 (``errorMessage``, the ajv-errors convention)."""
    allowed = allowed_modules()
    modules = "|".join(re.escape(a) for a in allowed)
    function = schema["properties"]["function"]
    function["pattern"] = rf"^(?:{modules})(\.{_IDENTIFIER})*:{_IDENTIFIER}$" if allowed else "^(?!)"
    function["errorMessage"] = refusal(allowed)
    function["description"] = f"{function.get('description', '')}; allowed here: {', '.join(allowed) or 'none'}"
    return schema


def resolve(ref: str) -> Callable[..., Any]:
    """Import ``module.path:function``; a clear ``PeriodicError`` if that is not possible or
    not allowed. The allow list is checked before the import (importing runs the module's
    code) and again on the object found, which must be *defined* in an allowed module: a
    name an allowed module merely imported (``from os import system``) does not count."""
    module_name, _, attribute = ref.partition(":")
    allowed = allowed_modules()
    if not module_allowed(module_name, allowed):
        raise PeriodicError(f"{ref} refused: {refusal(allowed)}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PeriodicError(f"cannot import module {module_name!r} of function {ref!r}: {e}") from e
    fn = getattr(module, attribute, None)
    if fn is None:
        raise PeriodicError(f"module {module_name!r} has no attribute {attribute!r}")
    if not callable(fn):
        raise PeriodicError(f"{ref} is a {type(fn).__name__}, not a function")
    defined_in = getattr(fn, "__module__", None)
    if not isinstance(defined_in, str) or not module_allowed(defined_in, allowed):
        raise PeriodicError(f"{ref} refused: it is defined in module {defined_in!r}; {refusal(allowed)}")
    return fn  # type: ignore[no-any-return]


def jsonable(value: Any) -> Any:
    """``value`` itself if it is JSON, else its (truncated) ``repr``."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)[:_MAX_REPR_CHARS]
    return value


class CallTimedOut(Exception):
    """A call ran over ``timeout_s`` and was cancelled."""


async def _call(fn: Callable[..., Any], args: PeriodicArgs, ctx: ObserverContext) -> Any:
    # An async function, or an object with an ``async def __call__``.
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
    limit = asyncio.timeout(args.timeout_s)
    try:
        async with limit:
            if is_async:
                return await fn(ctx, **args.kwargs)
            return await asyncio.to_thread(fn, ctx, **args.kwargs)
    except TimeoutError:
        if not limit.expired():
            raise  # the function's own TimeoutError: an ordinary error
        if is_async:
            raise CallTimedOut(f"timed out after {args.timeout_s}s (cancelled)") from None
        raise PeriodicError(
            f"sync function {args.function} ran over timeout_s={args.timeout_s}s; its thread cannot be "
            "killed, so the observer gives up (use an async function or isolation 'process')"
        ) from None


async def run(args: PeriodicArgs, ctx: ObserverContext) -> None:
    fn = resolve(args.function)
    loop = asyncio.get_running_loop()
    origin, slot, calls, errors = loop.time(), 0, 0, 0
    while True:
        calls += 1
        ctx.ensure_lease()
        began = time.perf_counter()
        outcome: dict[str, Any]
        try:
            outcome = {"result": jsonable(await _call(fn, args, ctx))}
            errors = 0
        except (LeaseLost, PeriodicError):
            raise
        except Exception as e:  # any failure of user code is counted, not fatal at once
            errors += 1
            error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            ctx.logger.warning("call %d of %s failed (%d in a row): %s", calls, args.function, errors, error)
            if errors >= args.max_consecutive_errors:
                raise PeriodicError(f"{errors} consecutive errors calling {args.function}, last: {error}") from e
            outcome = {"error": error}
        if args.emit_results:
            await ctx.emit({"call": calls, "duration_s": round(time.perf_counter() - began, 6)} | outcome)
        previous, slot = slot, next_slot(origin, args.interval_s, slot, loop.time())
        if slot > previous + 1:
            ctx.logger.debug("call %d of %s overran: %d slot(s) skipped", calls, args.function, slot - previous - 1)
        await asyncio.sleep(max(0.0, origin + slot * args.interval_s - loop.time()))


KIND: ObserverKind[PeriodicArgs] = ObserverKind(
    name="periodic",
    args_model=PeriodicArgs,
    run=run,
    description="calls function every interval_s (no overlap, hard timeout): a cluster-wide singleton cron job",
    announce=announce,
)
