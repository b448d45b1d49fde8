"""Message contracts: JSON on the wire, one pydantic model per message, ``type`` discriminator.

Three streams (see ``shared.topology``):
* start queue of a pool — ``StartObserver`` (manager → any service of the pool);
* control fanout — ``StopObserver`` and ``InventoryRequest`` (manager → every service);
* state queue — service → manager reports (``StateMessage``).

Every model is frozen and forbids unknown fields, so a malformed or foreign body fails
``decode_*`` with ``DecodeError`` and is dead-lettered by the consumer.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from shared.errors import DecodeError


def utcnow() -> datetime:
    return datetime.now(UTC)


class Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    message_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    sent_at: datetime = Field(default_factory=utcnow)

    def encode(self) -> bytes:
        return self.model_dump_json().encode()


# --- start queue -----------------------------------------------------------------------


class StartObserver(Message):
    type: Literal["StartObserver"] = "StartObserver"
    observer_id: uuid.UUID
    name: str
    kind: str
    args: dict[str, Any] = Field(default_factory=dict)
    pool: str = "default"


# --- control fanout --------------------------------------------------------------------


class StopObserver(Message):
    """Stop an observer. With ``service_id`` set only that service acts, and it acks its
    delivery instead of keeping it (used to remove a duplicate copy)."""

    type: Literal["StopObserver"] = "StopObserver"
    observer_id: uuid.UUID
    service_id: uuid.UUID | None = None
    reason: str = "requested"


class InventoryRequest(Message):
    """Ask services (all, or the one named) to send their inventory now."""

    type: Literal["InventoryRequest"] = "InventoryRequest"
    service_id: uuid.UUID | None = None


# --- state queue -----------------------------------------------------------------------


class ServiceBorn(Message):
    type: Literal["ServiceBorn"] = "ServiceBorn"
    service_id: uuid.UUID
    name: str
    workers_count: int
    pools: list[str]
    kinds: list[str]
    host: str
    pid: int
    version: str


class ServiceHeartbeat(Message):
    type: Literal["ServiceHeartbeat"] = "ServiceHeartbeat"
    service_id: uuid.UUID
    running: int
    loop_lag_ms: float = 0.0


class ServiceStopped(Message):
    type: Literal["ServiceStopped"] = "ServiceStopped"
    service_id: uuid.UUID
    released: list[uuid.UUID] = Field(default_factory=list)


class ServiceInventory(Message):
    type: Literal["ServiceInventory"] = "ServiceInventory"
    service_id: uuid.UUID
    observer_ids: list[uuid.UUID]


class ObserverStarted(Message):
    type: Literal["ObserverStarted"] = "ObserverStarted"
    observer_id: uuid.UUID
    service_id: uuid.UUID
    attempt: int = 1
    redelivered: bool = False


class ObserverStopped(Message):
    type: Literal["ObserverStopped"] = "ObserverStopped"
    observer_id: uuid.UUID
    service_id: uuid.UUID
    reason: str = "stopped"


class ObserverFailed(Message):
    type: Literal["ObserverFailed"] = "ObserverFailed"
    observer_id: uuid.UUID
    service_id: uuid.UUID
    reason: str


ObserverReport = Annotated[ObserverStarted | ObserverStopped | ObserverFailed, Field(discriminator="type")]


class ReportBatch(Message):
    """Consecutive observer reports of one service in one message, in the order they were
    made (a service starting thousands of observers sends tens of messages, not thousands)."""

    type: Literal["ReportBatch"] = "ReportBatch"
    service_id: uuid.UUID
    reports: list[ObserverReport]


class StopObservers(Message):
    """Many stops in one broadcast (bulk stop, re-sends); same meaning as ``StopObserver``."""

    type: Literal["StopObservers"] = "StopObservers"
    observer_ids: list[uuid.UUID]
    service_id: uuid.UUID | None = None
    reason: str = "requested"


STOPS_PER_MESSAGE = 1000


def stop_messages(
    observer_ids: list[uuid.UUID], reason: str, service_id: uuid.UUID | None = None
) -> list[StopObservers]:
    """Stops for many observers, in messages of at most ``STOPS_PER_MESSAGE`` ids."""
    return [
        StopObservers(observer_ids=observer_ids[i : i + STOPS_PER_MESSAGE], service_id=service_id, reason=reason)
        for i in range(0, len(observer_ids), STOPS_PER_MESSAGE)
    ]


StateMessage = Annotated[
    ServiceBorn
    | ServiceHeartbeat
    | ServiceStopped
    | ServiceInventory
    | ObserverStarted
    | ObserverStopped
    | ObserverFailed
    | ReportBatch,
    Field(discriminator="type"),
]
ControlMessage = Annotated[StopObserver | StopObservers | InventoryRequest, Field(discriminator="type")]

_state_adapter: TypeAdapter[StateMessage] = TypeAdapter(StateMessage)
_control_adapter: TypeAdapter[ControlMessage] = TypeAdapter(ControlMessage)
_start_adapter: TypeAdapter[StartObserver] = TypeAdapter(StartObserver)

T = TypeVar("T")


def _decode(adapter: TypeAdapter[T], body: bytes) -> T:
    try:
        return adapter.validate_json(body)
    except ValidationError as e:
        raise DecodeError(f"invalid message: {e.error_count()} error(s): {e.errors()[:3]}") from e


def decode_state(body: bytes) -> StateMessage:
    return _decode(_state_adapter, body)


def decode_control(body: bytes) -> ControlMessage:
    return _decode(_control_adapter, body)


def decode_start(body: bytes) -> StartObserver:
    return _decode(_start_adapter, body)
