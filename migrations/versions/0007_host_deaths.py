"""``host_deaths``: one row per host death, so the probation check can tell cheaply that no
observer can have reached its threshold

``probation.host_died`` counted every victim's ``host_lost`` events in the window: an index
probe per victim, 4.6 s over the 333,000 of one dead service at 1,000,000, on PostgreSQL
beside the failover that death caused. No observer can have lost more hosts in the window
than hosts died in it, so while fewer than ``after_host_deaths`` died the count is skipped.

Filled from the ``host_lost`` history already written (one death per dead service id), so
a death recorded before the upgrade still counts toward the window.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "host_deaths",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("service_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_host_deaths_at", "host_deaths", ["at"])
    op.execute(
        "INSERT INTO host_deaths (service_id, at) "
        "SELECT service_id, at FROM observer_events WHERE event = 'host_lost' AND service_id IS NOT NULL "
        "GROUP BY service_id, at"
    )


def downgrade() -> None:
    op.drop_index("ix_host_deaths_at", table_name="host_deaths")
    op.drop_table("host_deaths")
