"""when each stop still OnDeleting was asked for, and an index to find the oldest

``observers.modified_at`` cannot say how long a stop has waited: the re-stop repair touches it
every period. ``stop_requested_at`` is set with the status OnDeleting, and the partial index
keeps ``/metrics``'s oldest stop (``orch_observers_stopping_oldest_seconds``) one index entry
away. It changes only together with the status, which is indexed already, so the updates
that stayed in place (HOT: moves, heartbeats' fields) still do. Nullable, no default: no
table rewrite.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("observers", sa.Column("stop_requested_at", sa.DateTime(timezone=True), nullable=True))
    # Rows OnDeleting before this migration get their last change as a stand-in.
    op.execute("UPDATE observers SET stop_requested_at = modified_at WHERE status = 'OnDeleting'")
    op.create_index(
        "ix_observers_stopping",
        "observers",
        ["stop_requested_at"],
        postgresql_where=sa.text("status = 'OnDeleting'"),
    )


def downgrade() -> None:
    op.drop_index("ix_observers_stopping", table_name="observers")
    op.drop_column("observers", "stop_requested_at")
