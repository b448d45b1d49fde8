"""drop ``ix_observers_status_pool``: nothing reads observers by (status, pool) any more

It served the capacity check and the stats when they counted rows; they read
``observer_counts`` since migration 0003. Every status filter left (the API's list, the
repairs) is served by ``ix_observers_status_created``, whose first column is the status.
The index still cost a write on every create and on every update that is not HOT, which a
failover makes for each observer it moves (``service_id`` is indexed).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_observers_status_pool", "observers")


def downgrade() -> None:
    op.create_index("ix_observers_status_pool", "observers", ["status", "pool"])
