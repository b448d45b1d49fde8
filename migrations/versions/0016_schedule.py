"""scheduled start and stop: the Scheduled status, start_at / stop_at / run_for_s, and the
two partial indexes the scheduler reads (``manager/state/scheduler.py``)

``ALTER TYPE ... ADD VALUE`` may run inside a transaction since PostgreSQL 12, but the new
value cannot be used until that transaction commits, and the indexes' predicates use it:
so it runs in Alembic's ``autocommit_block`` (which commits what ran before it), and the
indexes after. The columns are nullable with no default: no table rewrite. The indexes hold
only Scheduled rows and rows with a stop time, so an index scan finds the due ones at any
size of ``observers`` (``python -m bench.schedule``).

A downgrade cannot remove an enum value (PostgreSQL has no ``DROP VALUE``); it refuses while
any row is Scheduled and leaves the value in the type.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("ALTER TYPE observer_status ADD VALUE IF NOT EXISTS 'Scheduled' BEFORE 'Created'")
    op.add_column("observers", sa.Column("start_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("observers", sa.Column("stop_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("observers", sa.Column("run_for_s", sa.Float(), nullable=True))
    op.create_index(
        "ix_observers_due_start", "observers", ["start_at"], postgresql_where=sa.text("status = 'Scheduled'")
    )
    op.create_index(
        "ix_observers_due_stop",
        "observers",
        ["stop_at"],
        postgresql_where=sa.text("stop_at IS NOT NULL AND status IN ('Scheduled', 'Created', 'Processing')"),
    )


def downgrade() -> None:
    op.execute(
        "DO $$ BEGIN IF EXISTS (SELECT 1 FROM observers WHERE status = 'Scheduled') THEN "
        "RAISE EXCEPTION 'observers are Scheduled: stop them before downgrading'; END IF; END $$"
    )
    op.drop_index("ix_observers_due_stop", table_name="observers")
    op.drop_index("ix_observers_due_start", table_name="observers")
    op.drop_column("observers", "run_for_s")
    op.drop_column("observers", "stop_at")
    op.drop_column("observers", "start_at")
