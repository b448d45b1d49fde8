"""the leader's proof that it can write: one row the leader writes every quarter of
``ORCH_LEADER_TIMEOUT_S`` on its lock's session (``manager/state/leadership.py``).

An advisory lock proves a session, not a writable primary: PostgreSQL grants one on a hot
standby and on a primary set read-only for a switchover, so a manager that reached such a
server would lead beside the one on the primary. A write cannot be done there.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "leader",
        sa.Column("id", sa.SmallInteger(), sa.CheckConstraint("id = 1", name="ck_leader_one_row"), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leader")
