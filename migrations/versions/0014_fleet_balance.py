"""even load and drains: pinned observers, draining services

``observers.pinned``: created with ``"rebalance": false``, never moved to even the load.
``services.draining``: an operator asked to drain it (``POST /api/services/{id}/drain``): it
takes no new starts and hands its observers over; ``services.drain_note`` says how the drain
goes ("drained", or what it waits for). A boolean with a constant default is a catalog change
in PostgreSQL 11+, not a table rewrite.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("observers", sa.Column("pinned", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("services", sa.Column("draining", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("services", sa.Column("drain_note", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("services", "drain_note")
    op.drop_column("services", "draining")
    op.drop_column("observers", "pinned")
