"""services and observers

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

service_status = postgresql.ENUM("alive", "lost", "deleted", name="service_status", create_type=False)
observer_status = postgresql.ENUM(
    "Created", "Processing", "OnDeleting", "Deleted", "Failed", name="observer_status", create_type=False
)


def upgrade() -> None:
    service_status.create(op.get_bind(), checkfirst=True)
    observer_status.create(op.get_bind(), checkfirst=True)
    jsonb_list = sa.text("'[]'::jsonb")
    op.create_table(
        "services",
        sa.Column("id", postgresql.UUID(as_uuid=True), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("workers_count", sa.Integer, nullable=False),
        sa.Column("pools", postgresql.JSONB, nullable=False, server_default=jsonb_list),
        sa.Column("kinds", postgresql.JSONB, nullable=False, server_default=jsonb_list),
        sa.Column("host", sa.String(255), nullable=False, server_default=""),
        sa.Column("pid", sa.Integer),
        sa.Column("version", sa.String(50), nullable=False, server_default=""),
        sa.Column("status", service_status, nullable=False),
        sa.Column("is_deleted", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("running", sa.Integer, nullable=False, server_default="0"),
        sa.Column("loop_lag_ms", sa.Float, nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("modified_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_services_status_name", "services", ["status", "name"])
    op.create_table(
        "observers",
        sa.Column("id", postgresql.UUID(as_uuid=True), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(100), nullable=False),
        sa.Column("args", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("pool", sa.String(64), nullable=False, server_default="default"),
        sa.Column("status", observer_status, nullable=False),
        sa.Column("service_id", postgresql.UUID(as_uuid=True), sa.ForeignKey("services.id")),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("modified_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index(
        "uq_observers_live_name",
        "observers",
        ["name"],
        unique=True,
        postgresql_where=sa.text("status NOT IN ('Deleted', 'Failed')"),
    )
    op.create_index("ix_observers_created", "observers", ["created_at", "id"])
    op.create_index("ix_observers_service", "observers", ["service_id"])
    op.create_index("ix_observers_status_pool", "observers", ["status", "pool"])
    # Starts not yet confirmed by the broker. A table of its own so that marking a start
    # enqueued never contends for the observer rows the state consumer is updating.
    op.create_table(
        "pending_starts",
        sa.Column(
            "observer_id",
            postgresql.UUID(as_uuid=True),
            sa.ForeignKey("observers.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    op.drop_table("pending_starts")
    op.drop_table("observers")
    op.drop_table("services")
    observer_status.drop(op.get_bind(), checkfirst=True)
    service_status.drop(op.get_bind(), checkfirst=True)
