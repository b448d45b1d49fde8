"""observer counts kept by triggers (stats and capacity without scanning observers), and an
index for the list's most common page (a status, oldest first)

Every statement that inserts, updates or deletes observers appends its net change per
(kind, pool, status) to ``observer_count_deltas`` (statement-level triggers with transition
tables: one row per group and statement, not per observer). The manager folds the deltas
into ``observer_counts`` every sweep. The count of a group is its ``observer_counts`` row
plus its pending deltas; both are read in one statement, so a reader never sees a fold
half done. Appending instead of updating one counter row keeps concurrent writers (API,
state consumer, another manager) from queueing on a hot row.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUS = postgresql.ENUM(name="observer_status", create_type=False)

_FUNCTION = """
CREATE FUNCTION observer_count_deltas() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO observer_count_deltas (kind, pool, status, n)
        SELECT kind, pool, status, count(*) FROM new_rows GROUP BY 1, 2, 3;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO observer_count_deltas (kind, pool, status, n)
        SELECT kind, pool, status, -count(*) FROM old_rows GROUP BY 1, 2, 3;
    ELSE
        INSERT INTO observer_count_deltas (kind, pool, status, n)
        SELECT kind, pool, status, sum(d) FROM (
            SELECT kind, pool, status, 1 AS d FROM new_rows
            UNION ALL
            SELECT kind, pool, status, -1 AS d FROM old_rows
        ) AS changes
        GROUP BY 1, 2, 3
        HAVING sum(d) <> 0;
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    for table in ("observer_counts", "observer_count_deltas"):
        columns: list[sa.schema.SchemaItem] = [
            sa.Column("kind", sa.String(100), nullable=False),
            sa.Column("pool", sa.String(64), nullable=False),
            sa.Column("status", _STATUS, nullable=False),
            sa.Column("n", sa.BigInteger, nullable=False),
        ]
        if table == "observer_counts":
            op.create_table(table, *columns, sa.PrimaryKeyConstraint("kind", "pool", "status"))
        else:
            op.create_table(table, sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True), *columns)
    op.execute(_FUNCTION)
    # Transition tables need one trigger per event.
    op.execute(
        "CREATE TRIGGER observers_count_insert AFTER INSERT ON observers REFERENCING NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION observer_count_deltas()"
    )
    op.execute(
        "CREATE TRIGGER observers_count_update AFTER UPDATE ON observers "
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION observer_count_deltas()"
    )
    op.execute(
        "CREATE TRIGGER observers_count_delete AFTER DELETE ON observers REFERENCING OLD TABLE AS old_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION observer_count_deltas()"
    )
    # Rows that exist already (the triggers count from now on; no writer runs during a migration).
    op.execute(
        "INSERT INTO observer_counts (kind, pool, status, n) "
        "SELECT kind, pool, status, count(*) FROM observers GROUP BY 1, 2, 3"
    )
    # GET /api/observers?status=X pages oldest first: walk the index, stop after a page.
    op.create_index("ix_observers_status_created", "observers", ["status", "created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_observers_status_created", table_name="observers")
    for event in ("insert", "update", "delete"):
        op.execute(f"DROP TRIGGER observers_count_{event} ON observers")
    op.execute("DROP FUNCTION observer_count_deltas()")
    op.drop_table("observer_count_deltas")
    op.drop_table("observer_counts")
