"""observers.awaiting_broker_since: when a Created observer's start began to wait for the broker
to hand it on, because the broker session of the service that ran it ended (a node died or was
cut off) while the queue still holds the start for that session (issue 65).

Set by the state consumer's inventory rule, cleared by the next start or move; read only
together with ``status = 'Created' AND service_id IS NULL``. The partial index keeps
``GET /api/stats``'s count cheap: few observers wait at once, and most rows never set it.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("observers", sa.Column("awaiting_broker_since", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_observers_awaiting_broker",
        "observers",
        ["awaiting_broker_since"],
        postgresql_where=sa.text("awaiting_broker_since IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_observers_awaiting_broker", table_name="observers")
    op.drop_column("observers", "awaiting_broker_since")
