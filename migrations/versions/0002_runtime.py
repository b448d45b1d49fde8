"""observer runtime: retry policy and isolation per observer, kinds announced by services,
observer history (events)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "services",
        sa.Column("kind_infos", postgresql.JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
    )
    op.add_column("services", sa.Column("process_slots", sa.Integer, nullable=False, server_default="0"))
    # The retry policy in force for the observer (settings' defaults merged with the create
    # request); NULL for rows created before this revision, which run with the defaults.
    op.add_column("observers", sa.Column("retry", postgresql.JSONB))
    op.add_column("observers", sa.Column("isolation", sa.String(16)))
    op.add_column("observers", sa.Column("memory_limit_mb", sa.Float))
    # GET /api/observers?sort=attempts pages by (-attempts, id).
    op.create_index("ix_observers_attempts", "observers", [sa.text("(- attempts)"), "id"])
    # Append-only history. Also what quarantine counts: ``moved`` away from a host that is
    # later found dead becomes ``host_lost``.
    op.create_table(
        "observer_events",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column(
            "observer_id",
            postgresql.UUID(as_uuid=True),
            sa.ForeignKey("observers.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("service_id", postgresql.UUID(as_uuid=True)),
        sa.Column("from_service_id", postgresql.UUID(as_uuid=True)),
        sa.Column("detail", sa.Text),
    )
    op.create_index("ix_observer_events_observer", "observer_events", ["observer_id", "id"])
    op.create_index(
        "ix_observer_events_moved_from",
        "observer_events",
        ["from_service_id", "at"],
        postgresql_where=sa.text("event = 'moved'"),
    )


def downgrade() -> None:
    op.drop_table("observer_events")
    op.drop_index("ix_observers_attempts", "observers")
    op.drop_column("observers", "memory_limit_mb")
    op.drop_column("observers", "isolation")
    op.drop_column("observers", "retry")
    op.drop_column("services", "process_slots")
    op.drop_column("services", "kind_infos")
