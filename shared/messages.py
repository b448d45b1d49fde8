"""Message contracts: JSON on the wire, one pydantic model per message, ``type`` discriminator.

Three streams (see ``shared.topology``):
* start queue of a pool: ``StartObserver`` (manager → any service of the pool);
* control fanout (manager → every service; one naming a service is for that one only):
  ``ControlMessage``: stops and hand-overs (``StopObservers``), ``SetPlacement``,
  ``InventoryRequest``, ``IsolateObservers``, ``IntroduceRequest`` and ``DescribeRequest``;
* state queue (service → manager): ``StateMessage``: the service's life (``ServiceBorn``,
  ``ServiceHeartbeat``, ``ServiceStopped``), what it runs (``ServiceInventory``,
  ``ServiceDigest``, ``ObserversDescribed``) and observer reports, usually packed in a
  ``ReportBatch`` (``ObserversStarted`` for a run of starts, ``ObserversHandedOver``).

One module holds every contract on the wire, so the whole protocol reads in one place: that is
why it is longer than the others.

Every model is frozen and forbids unknown fields, so a malformed or foreign body fails
``decode_*`` with ``DecodeError`` and is dead-lettered by the consumer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

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


class RetryPolicy(BaseModel):
    """How a service restarts, in place, an observer whose body returned or raised.

    Attempt n (n >= 2) starts after ``min(max_delay_s, initial_delay_s * factor**(n-2))``
    seconds, scaled by a random factor in ``[1 - jitter, 1 + jitter]``. After
    ``max_attempts`` runs in a row that ended (``None``: never give up) the observer is
    Failed. A run that lasted ``reset_after_s`` or more counts as stable: the count
    starts over."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int | None = Field(default=5, ge=1, le=1_000_000, description="null = retry forever")
    initial_delay_s: float = Field(default=1.0, ge=0, le=3600)
    factor: float = Field(default=2.0, ge=1, le=100)
    max_delay_s: float = Field(default=60.0, ge=0, le=86_400)
    jitter: float = Field(default=0.1, ge=0, le=1, description="fraction of the delay, e.g. 0.1 = ±10 %")
    reset_after_s: float = Field(default=60.0, ge=0, le=86_400 * 30)

    def delay_s(self, failures: int, spread: float) -> float:
        """Delay before the next run after ``failures`` (>= 1) ended runs in a row;
        ``spread`` is a random number in [-1, 1]."""
        base = min(self.max_delay_s, self.initial_delay_s * self.factor ** min(failures - 1, 64))
        return max(0.0, base * (1 + self.jitter * spread))

    def gives_up(self, failures: int) -> bool:
        return self.max_attempts is not None and failures >= self.max_attempts


Isolation = Literal["async", "process"]


class StartObserver(Message):
    type: Literal["StartObserver"] = "StartObserver"
    observer_id: uuid.UUID
    name: str
    kind: str
    args: dict[str, Any] = Field(default_factory=dict)
    pool: str = "default"
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    # None: the kind's own isolation.
    isolation: Isolation | None = None
    # Process isolation only: the child is killed (and restarted under ``retry``) above this RSS.
    memory_limit_mb: float | None = None
    # How many times it was restarted after Failed (``POST /restart``): a stop of an older life
    # never throws this start away.
    life: int = Field(default=0, ge=0)


# --- control fanout --------------------------------------------------------------------


class IsolateObservers(Message):
    """Probation: the named service runs these observers in child processes of their own
    from now on (restarted in place; the start delivery stays held). Sent again whenever a
    service reports one of them started, since the start message itself does not change."""

    type: Literal["IsolateObservers"] = "IsolateObservers"
    observer_ids: list[uuid.UUID]
    service_id: uuid.UUID
    reason: str = "probation"


class IntroduceRequest(Message):
    """The manager does not know this service (its ``ServiceBorn`` was lost, or the
    database was restored from an older backup): send ``ServiceBorn`` again."""

    type: Literal["IntroduceRequest"] = "IntroduceRequest"
    service_id: uuid.UUID
    # True: another live service took its name (two services started with one name, e.g.
    # the default host name on one host): it must take a name of its own.
    name_taken: bool = False


class DescribeRequest(Message):
    """The manager found these observers running on the named service with no row (its
    database was restored from an older backup): send their start messages, to adopt them."""

    type: Literal["DescribeRequest"] = "DescribeRequest"
    service_id: uuid.UUID
    observer_ids: list[uuid.UUID]


# The consumer priorities of a placement (``SetPlacement``): a service under its fair share of
# a pool, at it, over it (docs/design.md, "Even load"). The broker gives each start to the
# highest priority with a free worker.
UNDER, EVEN, OVER = 2, 1, 0


class SetPlacement(Message):
    """How the named service takes new starts from now on (docs/design.md, "Even load"): it
    consumes its pools' start queues with consumer priority ``priority`` (the broker gives each
    start to the highest priority with a free worker), or not at all while ``cordoned`` (a
    drain). ``pools`` gives a pool a priority of its own (a service in two pools may be under
    its share in one and over it in the other); only sent when they differ, since a service
    older than it refuses the field. The manager's balancer sends it whenever a heartbeat
    reports something else."""

    type: Literal["SetPlacement"] = "SetPlacement"
    service_id: uuid.UUID
    priority: int = Field(default=0, ge=-100, le=100)
    cordoned: bool = False
    pools: dict[str, Annotated[int, Field(ge=-100, le=100)]] = Field(default_factory=dict)
    # How many start queues each pool has (``ORCH_START_QUEUES``): the service consumes them
    # all. Left out at 1, so a service older than it takes the rest.
    start_queues: int = Field(default=1, ge=1, le=64)  # manager.settings.MAX_START_QUEUES (it imports this)

    def encode(self) -> bytes:
        return self.model_dump_json(exclude={"start_queues"} if self.start_queues == 1 else None).encode()


class SetStartQueues(Message):
    """Sent to a service as soon as its ServiceBorn is applied when a pool has several start
    queues (``ORCH_START_QUEUES``): it consumes that many of each of its pools from now on,
    without waiting for the balancer's first ``SetPlacement`` (a round later)."""

    type: Literal["SetStartQueues"] = "SetStartQueues"
    service_id: uuid.UUID
    start_queues: int = Field(ge=1, le=64)  # manager.settings.MAX_START_QUEUES (it imports this)


class RetireStarts(Message):
    """Move at most ``count`` of the starts this service holds, in session ``session_id``,
    from start queues past the first ``keep`` of a pool (``ORCH_START_QUEUES`` was lowered;
    docs/design.md, "A pool over several start queues"): each observer is ended, its delivery
    acked, and ``StartsGone`` tells the manager, which publishes it again to its queue under
    ``keep``. The balancer sends it, within its moves per second, to the services whose
    heartbeats say they hold starts from such a queue (``ServiceHeartbeat.queue_held``)."""

    type: Literal["RetireStarts"] = "RetireStarts"
    service_id: uuid.UUID
    session_id: uuid.UUID
    keep: int = Field(ge=1, le=64)  # manager.settings.MAX_START_QUEUES (it imports this)
    count: int = Field(ge=1)


class InventoryRequest(Message):
    """Ask services (all, or the one named) to send their inventory now."""

    type: Literal["InventoryRequest"] = "InventoryRequest"
    service_id: uuid.UUID | None = None


# --- state queue -----------------------------------------------------------------------


class KindInfo(BaseModel):
    """An observer kind as a service announces it: the manager validates ``args`` of new
    observers against ``args_schema`` (JSON Schema of the kind's pydantic model)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str = ""
    isolation: Isolation = "async"
    rebalance: bool = True  # False: its observers are pinned unless a create says otherwise
    args_schema: dict[str, Any] = Field(default_factory=dict)


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
    kind_infos: list[KindInfo] = Field(default_factory=list)
    # How many of the workers may run in child processes (isolation "process").
    process_slots: int = 0


class ServiceHeartbeat(Message):
    type: Literal["ServiceHeartbeat"] = "ServiceHeartbeat"
    service_id: uuid.UUID
    running: int
    loop_lag_ms: float = 0.0
    # The broker session it speaks from: a service's death takes the moves of that session only
    # (``manager/state/probation.py``). None: a service of an older version.
    session_id: uuid.UUID | None = None
    # What the broker refuses this service for good now (a pool's start queue it cannot
    # consume, and why: ``observer_service/refusals.py``); None: nothing.
    refused: str | None = None
    # The placement it consumes under (``SetPlacement``).
    priority: int = 0
    cordoned: bool = False
    pool_priorities: dict[str, int] = Field(default_factory=dict)
    start_queues: int = 1
    # How many starts it holds from each start queue index (summed over its pools), while it
    # consumes more than one: the balancer retires the queues past ``ORCH_START_QUEUES``
    # from it (``RetireStarts``). Left out when empty, so a manager older than it takes the rest.
    queue_held: list[int] = Field(default_factory=list)

    def encode(self) -> bytes:
        return self.model_dump_json(exclude=None if self.queue_held else {"queue_held"}).encode()


class ServiceStopped(Message):
    type: Literal["ServiceStopped"] = "ServiceStopped"
    service_id: uuid.UUID
    released: list[uuid.UUID] = Field(default_factory=list)


class ServiceInventory(Message):
    type: Literal["ServiceInventory"] = "ServiceInventory"
    service_id: uuid.UUID
    observer_ids: list[uuid.UUID]
    # The broker session that holds them (what the list says is true only while it lives).
    session_id: uuid.UUID | None = None


class ServiceDigest(Message):
    """What a service runs, as a count and an XOR instead of a list, whose size grows with
    the fleet (docs/design.md, "What grows with the fleet"). The manager compares it with its
    rows and asks for the whole inventory (``InventoryRequest``) only when they differ."""

    type: Literal["ServiceDigest"] = "ServiceDigest"
    service_id: uuid.UUID
    session_id: uuid.UUID
    count: int = Field(ge=0)
    digest: str = Field(pattern=r"^[0-9a-f]{32}$")


def digest_of(observer_ids: Iterable[uuid.UUID]) -> str:
    """The XOR of the ids' 128 bits, as 32 hex digits: independent of order, and the same
    computed by PostgreSQL over the manager's rows (``manager/db/digests.py``). Random
    (uuid4) ids make two different sets collide with probability about 2^-122."""
    acc = 0
    for observer_id in observer_ids:
        acc ^= observer_id.int
    return digest_text(acc)


def digest_text(xor: int) -> str:
    """How a digest travels and is compared: the 128-bit XOR as 32 hex digits."""
    return f"{xor:032x}"


class ObserversStarted(Message):
    """Observers started by one service in one broker session, with the same ``redelivered``
    and ``isolation``, in the order they started: a failover hands each survivor hundreds of
    thousands of starts, and an id in a list costs far less than a report each
    (docs/design.md, "What grows with the fleet")."""

    type: Literal["ObserversStarted"] = "ObserversStarted"
    service_id: uuid.UUID
    session_id: uuid.UUID | None = None
    redelivered: bool = False
    isolation: Isolation = "async"
    observer_ids: list[uuid.UUID] = Field(min_length=1)


class ObserversHandedOver(Message):
    """Observers this service ended and whose starts it gave back to their queues for another
    service to run (a ``StopObservers`` with ``hand_over``: the balancer evening the load, or a
    drain)."""

    type: Literal["ObserversHandedOver"] = "ObserversHandedOver"
    service_id: uuid.UUID
    session_id: uuid.UUID
    observer_ids: list[uuid.UUID] = Field(min_length=1)
    reason: str


# A service holds a start it declined at most this long before handing it on again.
DECLINED_HOLD_S = 5.0


class StartsDeclined(Message):
    """Starts this service was handed and cannot run (``reason``: a kind it lacks, no free
    process slot), which it handed on to another service (``observer_service/declines.py``).
    Until one runs it, such a start is held by a service (at most ``DECLINED_HOLD_S``) or on
    its way to one: the manager publishes no second copy of it, and says in its history why
    it waits."""

    type: Literal["StartsDeclined"] = "StartsDeclined"
    service_id: uuid.UUID
    observer_ids: list[uuid.UUID] = Field(min_length=1)
    reason: str


class StartsGone(Message):
    """The broker holds no copy any more of these starts, which this service held from a
    start queue of ``pools`` in session ``session_id``, and the service has stopped the
    observers: the queue was deleted (``observer_service/queue_watch.py``; ``retired`` False),
    or it is past ``ORCH_START_QUEUES`` and the service acked them off it (``RetireStarts``;
    ``retired`` True). The manager publishes again those it still knows on this service in
    this session (no copy is left anywhere), or ends a stop that was under way."""

    type: Literal["StartsGone"] = "StartsGone"
    service_id: uuid.UUID
    session_id: uuid.UUID
    pools: list[str]
    observer_ids: list[uuid.UUID] = Field(min_length=1)
    retired: bool = False

    def encode(self) -> bytes:
        return self.model_dump_json(exclude=None if self.retired else {"retired"}).encode()


class ObserversDescribed(Message):
    """The start messages of the observers named in a ``DescribeRequest`` that this service
    runs (the others it does not run: nothing to adopt)."""

    type: Literal["ObserversDescribed"] = "ObserversDescribed"
    service_id: uuid.UUID
    session_id: uuid.UUID
    starts: list[StartObserver]


class ObserverIsolated(Message):
    """The service now runs the observer in a child process (after ``IsolateObservers``)."""

    type: Literal["ObserverIsolated"] = "ObserverIsolated"
    observer_id: uuid.UUID
    service_id: uuid.UUID


class ObserverStopped(Message):
    type: Literal["ObserverStopped"] = "ObserverStopped"
    observer_id: uuid.UUID
    service_id: uuid.UUID
    reason: str = "stopped"


class ObserverRetrying(Message):
    """The observer's body ended (``error``); it runs again, as ``attempt``, in ``delay_s``."""

    type: Literal["ObserverRetrying"] = "ObserverRetrying"
    observer_id: uuid.UUID
    service_id: uuid.UUID
    attempt: int
    error: str
    delay_s: float


class ObserverFailed(Message):
    type: Literal["ObserverFailed"] = "ObserverFailed"
    observer_id: uuid.UUID
    service_id: uuid.UUID
    reason: str


ObserverReport = Annotated[
    ObserverStopped | ObserverRetrying | ObserverFailed | ObserverIsolated,
    Field(discriminator="type"),
]
# The same reports, for isinstance(): what ``ReportBatch`` packs and the manager applies once.
OBSERVER_REPORT_TYPES = (ObserverStopped, ObserverRetrying, ObserverFailed, ObserverIsolated)


class ReportBatch(Message):
    """Consecutive observer reports of one service in one message, in the order they were
    made (a service starting thousands of observers sends tens of messages, not thousands)."""

    type: Literal["ReportBatch"] = "ReportBatch"
    service_id: uuid.UUID
    reports: list[ObserverReport]


class StopObservers(Message):
    """Stop observers. With ``service_id`` set only that service acts, and it acks its
    delivery instead of keeping it (used to remove a duplicate copy). With ``session_id``
    set too, only the copy that service holds in that broker session: a stop decided about
    one copy must not hit a newer one the same service got since (the observer went A → B →
    back to A while the manager was behind). A broadcast (no ``service_id``) carries the
    life it stops of each observer (see ``StartObserver.life``)."""

    type: Literal["StopObservers"] = "StopObservers"
    observer_ids: list[uuid.UUID]
    service_id: uuid.UUID | None = None
    session_id: uuid.UUID | None = None
    reason: str = "requested"
    # The life of each observer stopped, in the order of ``observer_ids``; None on a stop
    # aimed at one service's copy, which names the session instead.
    lives: list[int] | None = None
    # With ``service_id``: end them there and give their starts back to the queue, for another
    # service to run (``ObserversHandedOver``), instead of acking them.
    hand_over: bool = False

    @model_validator(mode="after")
    def _lives_match(self) -> StopObservers:
        if self.lives is not None and len(self.lives) != len(self.observer_ids):
            raise ValueError("lives must list one life per observer id")
        if self.hand_over and self.service_id is None:
            raise ValueError("a hand-over names the service that holds the observers")
        return self


STOPS_PER_MESSAGE = 1000


def stop_messages(
    observer_ids: list[uuid.UUID],
    reason: str,
    service_id: uuid.UUID | None = None,
    session_id: uuid.UUID | None = None,
    lives: list[int] | None = None,
) -> list[StopObservers]:
    """Stops for many observers, in messages of at most ``STOPS_PER_MESSAGE`` ids."""
    return [
        StopObservers(
            observer_ids=observer_ids[i : i + STOPS_PER_MESSAGE],
            service_id=service_id,
            session_id=session_id,
            reason=reason,
            lives=None if lives is None else lives[i : i + STOPS_PER_MESSAGE],
        )
        for i in range(0, len(observer_ids), STOPS_PER_MESSAGE)
    ]


StateMessage = Annotated[
    ServiceBorn
    | ServiceHeartbeat
    | ServiceStopped
    | ServiceInventory
    | ServiceDigest
    | ObserversStarted
    | ObserversHandedOver
    | StartsDeclined
    | StartsGone
    | ObserverStopped
    | ObserverRetrying
    | ObserverFailed
    | ObserverIsolated
    | ObserversDescribed
    | ReportBatch,
    Field(discriminator="type"),
]
ControlMessage = Annotated[
    StopObservers
    | SetPlacement
    | SetStartQueues
    | RetireStarts
    | InventoryRequest
    | IsolateObservers
    | IntroduceRequest
    | DescribeRequest,
    Field(discriminator="type"),
]

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
