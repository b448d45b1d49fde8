"""ORM models. The schema changes only through Alembic migrations (``migrations/``)."""

from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class ObserverStatus(enum.StrEnum):
    SCHEDULED = "Scheduled"  # waits for its start_at; no start message yet (manager/state/scheduler.py)
    CREATED = "Created"
    PROCESSING = "Processing"
    ON_DELETING = "OnDeleting"
    DELETED = "Deleted"
    FAILED = "Failed"


LIVE_STATUSES = (ObserverStatus.CREATED, ObserverStatus.PROCESSING, ObserverStatus.ON_DELETING)
FINAL_STATUSES = (ObserverStatus.DELETED, ObserverStatus.FAILED)
# What counts against a pool's workers: the live ones, and the Scheduled ones, whose worker is
# reserved at create so that nothing can refuse their start at its time (docs/observers.md).
HOLDING_STATUSES = (ObserverStatus.SCHEDULED, *LIVE_STATUSES)


class ServiceStatus(enum.StrEnum):
    ALIVE = "alive"
    LOST = "lost"
    DELETED = "deleted"


def _enum(cls: type[enum.StrEnum], name: str) -> Enum:
    return Enum(cls, name=name, values_callable=lambda c: [m.value for m in c], native_enum=True)


class Service(Base):
    __tablename__ = "services"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    workers_count: Mapped[int] = mapped_column(Integer, nullable=False)
    process_slots: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    pools: Mapped[list[str]] = mapped_column(JSONB, nullable=False, server_default=text("'[]'::jsonb"))
    kinds: Mapped[list[str]] = mapped_column(JSONB, nullable=False, server_default=text("'[]'::jsonb"))
    # [KindInfo as JSON]: name, description, isolation, args_schema.
    kind_infos: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, nullable=False, server_default=text("'[]'::jsonb"))
    host: Mapped[str] = mapped_column(String(255), nullable=False, server_default="")
    pid: Mapped[int | None] = mapped_column(Integer)
    version: Mapped[str] = mapped_column(String(50), nullable=False, server_default="")
    status: Mapped[ServiceStatus] = mapped_column(_enum(ServiceStatus, "service_status"), nullable=False)
    is_deleted: Mapped[bool] = mapped_column(nullable=False, server_default=text("false"))
    running: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    loop_lag_ms: Mapped[float] = mapped_column(nullable=False, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    modified_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    last_heartbeat_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    # The broker session it last spoke from (migration 0012); None: not said.
    session_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # What the broker refuses it for good, as its last heartbeat said (migration 0013);
    # None: nothing (``observer_service/refusals.py``).
    refused: Mapped[str | None] = mapped_column(Text)
    # Being drained (migration 0014): no new starts, its observers handed over; the note says
    # how it goes ("drained", or what the drain waits for).
    draining: Mapped[bool] = mapped_column(nullable=False, server_default=text("false"))
    drain_note: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (Index("ix_services_status_name", "status", "name"),)


class Observer(Base):
    __tablename__ = "observers"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    kind: Mapped[str] = mapped_column(String(100), nullable=False)
    args: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    pool: Mapped[str] = mapped_column(String(64), nullable=False, server_default="default")
    status: Mapped[ObserverStatus] = mapped_column(_enum(ObserverStatus, "observer_status"), nullable=False)
    # No foreign key (migration 0010): a failover changes it for thousands of rows at once.
    # The state rules write only services they know (services rows are never deleted).
    # Not indexed (migration 0011): queries by service read ``ObserverHost``, so a move changes
    # no indexed column and PostgreSQL updates the row in place.
    service_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    last_error: Mapped[str | None] = mapped_column(Text)
    retry: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    isolation: Mapped[str | None] = mapped_column(String(16))
    memory_limit_mb: Mapped[float | None] = mapped_column(Float)
    # The broker session of the service holding its start: a stop aimed at one copy names it.
    # (A column named before "host" meant only a machine: the service's session.)
    host_session_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # Restarts after Failed: starts and broadcast stops carry it (a stop of an older life
    # never eats the start of a newer one, whatever the managers' clocks say).
    life: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    # Probation (``manager/state/probation.py``): set while it must run in a child process;
    # clean_since is when its current clean run in one began (None: not isolated yet).
    probation_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    probation_clean_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Created, on no service, since when its start waits for the broker to hand it on: the
    # broker session of the service that ran it ended (migration 0018). Stale otherwise.
    awaiting_broker_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Created with ``"rebalance": false`` (migration 0014): never moved to even the load.
    pinned: Mapped[bool] = mapped_column(nullable=False, server_default=text("false"))
    # When the stop of an OnDeleting row was asked for (migration 0015): re-stops touch
    # modified_at, not this; the oldest is one entry of ix_observers_stopping (``manager.db.oldest_stop``).
    stop_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The schedule (migration 0016): when a Scheduled row starts, when a live row is stopped
    # (``expired``), and how long it runs once started (stop_at is set from it at the start).
    start_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    stop_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    run_for_s: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    modified_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    # Not mapped: id_hi and id_lo, the id's halves as bigints, generated by PostgreSQL for the
    # services' digests (migration 0005, manager/db/digests.py); mapped, every ORM write
    # would read them back.

    __table_args__ = (
        # Names are unique among observers that are not Deleted/Failed.
        Index(
            "uq_observers_live_name",
            "name",
            unique=True,
            postgresql_where=text("status NOT IN ('Deleted', 'Failed')"),
        ),
        Index("ix_observers_created", "created_at", "id"),
        Index("ix_observers_status_created", "status", "created_at", "id"),
        Index("ix_observers_attempts", text("(- attempts)"), "id"),
        Index("ix_observers_probation", "probation_since", postgresql_where=text("probation_since IS NOT NULL")),
        Index(
            "ix_observers_awaiting_broker",
            "awaiting_broker_since",
            postgresql_where=text("awaiting_broker_since IS NOT NULL"),
        ),
        Index("ix_observers_stopping", "stop_requested_at", postgresql_where=text("status = 'OnDeleting'")),
        # The scheduler's two questions, each answered from a small index (migration 0016).
        Index("ix_observers_due_start", "start_at", postgresql_where=text("status = 'Scheduled'")),
        Index(
            "ix_observers_due_stop",
            "stop_at",
            postgresql_where=text("stop_at IS NOT NULL AND status IN ('Scheduled', 'Created', 'Processing')"),
        ),
        # Room on each page for a moved row's new version (an update in place; migration 0011).
        {"postgresql_with": {"fillfactor": 70}},
    )


class ObserverHost(Base):
    """``observers.service_id`` of every row that has one: what queries by service
    read (``manager.db.service_observers``). Written only by the triggers of migration 0011, in the
    statement that changes the observer row, so it always says what the rows say. The table's
    name, and so the class's, is older than "host" meaning only a machine: read "service"."""

    __tablename__ = "observer_hosts"

    observer_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    service_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)

    __table_args__ = (Index("ix_observer_hosts_service", "service_id", "observer_id"),)


class PendingStart(Base):
    """A start message not yet confirmed by the broker. Inserted with the observer, deleted
    once the broker confirmed its start; what a crash leaves here the pending-start repair publishes
    again. Kept apart from ``observers`` so marking a start enqueued never waits for the
    row locks of the state consumer."""

    __tablename__ = "pending_starts"

    observer_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("observers.id", ondelete="CASCADE"), primary_key=True
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class EventType(enum.StrEnum):
    CREATED = "created"
    STARTED = "started"
    MOVED = "moved"  # taken over by service_id from from_service_id (its start was redelivered)
    RETRYING = "retrying"
    STOP_REQUESTED = "stop_requested"
    STOPPED = "stopped"
    FAILED = "failed"
    RELEASED = "released"  # its service went away; waits for a new service
    HOST_LOST = "host_lost"  # its service (service_id) died while running it (an old name, kept)
    PROBATION = "probation"  # its services died too often while it ran: runs in a child process
    ISOLATED = "isolated"  # its service runs it in a child process now (probation)
    PROBATION_ENDED = "probation_ended"  # ran cleanly in a child for its reset_after_s
    ADOPTED = "adopted"  # found running with no row (database restored from an older backup)
    RESTARTED = "restarted"
    REBALANCED = "rebalanced"  # handed over by from_service_id to service_id (even load, or a drain)
    DUE = "due"  # its start_at came: its start was published (manager/state/scheduler.py)
    EXPIRED = "expired"  # its stop_at came: stopped (or, still Scheduled, Deleted unstarted)
    CANCELLED = "cancelled"  # stopped while Scheduled: Deleted, never started
    DECLINED = "declined"  # service_id cannot run it (detail says why) and handed its start on


class Leader(Base):
    """The leader's proof that it can write (migration 0017): its one row, written by the
    leader on its lock's session (``manager/state/leadership.py``)."""

    __tablename__ = "leader"

    id: Mapped[int] = mapped_column(SmallInteger, CheckConstraint("id = 1", name="ck_leader_one_row"), primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class AppliedStateMessage(Base):
    """A state message already applied (same transaction): a batch delivered again after a
    manager crash or a reconnect is skipped. Kept for ``APPLIED_RETENTION`` by the repairs."""

    __tablename__ = "applied_state_messages"

    message_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    applied_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())

    __table_args__ = (Index("ix_applied_state_messages_at", "applied_at"),)


class AbandonedObserver(Base):
    """An observer whose create was answered 503 (rows deleted) while some of its starts
    may have reached the broker: found running, it is stopped, never adopted."""

    __tablename__ = "abandoned_observers"

    observer_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())

    __table_args__ = (Index("ix_abandoned_observers_at", "at"),)


class HostDeath(Base):
    """A service judged dead (lost, or replaced by a restart under its name), at the instant its
    victims' ``host_lost`` events carry: how many died in a window bounds how many services any
    one observer can have lost in it (``manager/state/probation.py``). The table's name, and so
    the class's, is older than "host" meaning only a machine: read "service"."""

    __tablename__ = "host_deaths"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    service_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    __table_args__ = (Index("ix_host_deaths_at", "at"),)


class ObserverEvent(Base):
    """Append-only history of an observer (``GET /api/observers/{id}/events``)."""

    __tablename__ = "observer_events"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    # No foreign key (migration 0009): its check locked the observer row for every event
    # written, twice the cost of the insert. Deleting observers deletes their events too.
    observer_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    event: Mapped[str] = mapped_column(String(32), nullable=False)
    service_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    from_service_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    # A move: the old service's broker session that held the start (migration 0012).
    from_session_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    detail: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index("ix_observer_events_observer", "observer_id", "id"),
        Index(
            "ix_observer_events_moved_from",
            "from_service_id",
            "at",
            postgresql_where=text("event = 'moved'"),
        ),
    )
