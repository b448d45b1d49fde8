"""what the broker refuses a service for good, as its heartbeats say

A service whose pool's start queue the broker refuses (a queue argument or type it rejects,
a permission) keeps its session for the other pools and says what is refused in each
heartbeat (``observer_service/refusals.py``): ``services.refused`` keeps the last word, for
``GET /api/services`` and ``/readyz``. Nullable, no default: no table rewrite.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("services", sa.Column("refused", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("services", "refused")
