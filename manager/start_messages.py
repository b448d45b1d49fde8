"""Start messages: the one place one is built, from a create request's spec or an observer
row (restarts, the repairs that publish starts again, the rebuild).

Its own module, light on imports: the state process re-publishes starts (the pending-start and lost-start repairs, the
rebuild) and must not import the API's commands and kind validation (jsonschema, the
built-in kinds with httpx and websockets) to do it: about 0.4 s of its start, which a
catching-up manager spends before it applies the first report.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol, cast

from shared.messages import Isolation, RetryPolicy, StartObserver


class StartFields(Protocol):
    """What a start message is made of: an observer row, or a create request's spec."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def args(self) -> dict[str, Any]: ...
    @property
    def pool(self) -> str: ...
    @property
    def isolation(self) -> str | None: ...
    @property
    def memory_limit_mb(self) -> float | None: ...


def build_start(observer_id: uuid.UUID, fields: StartFields, retry: RetryPolicy, life: int = 0) -> StartObserver:
    """The one place a start message is built (creates, restarts and every re-publish)."""
    return StartObserver(
        observer_id=observer_id,
        name=fields.name,
        kind=fields.kind,
        args=fields.args,
        pool=fields.pool,
        retry=retry,
        isolation=cast("Isolation | None", fields.isolation),  # validated on create
        memory_limit_mb=fields.memory_limit_mb,
        life=life,
    )


class StoredStart(StartFields, Protocol):
    """An observer row, or a row a query returned with its columns."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def retry(self) -> dict[str, Any] | None: ...
    @property
    def life(self) -> int: ...


def start_message(obs: StoredStart) -> StartObserver:
    """The start message of an observer row (restart, the scheduler, the repairs, the
    rebuild). Raises if the row's stored fields no longer validate."""
    retry = RetryPolicy.model_validate(obs.retry) if obs.retry is not None else RetryPolicy()
    return build_start(obs.id, obs, retry, obs.life)
