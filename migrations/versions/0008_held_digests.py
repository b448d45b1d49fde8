"""what each service session holds, kept by triggers: count and XOR of ids per (service_id,
host_session_id), so a service's digest is compared without scanning its rows

A service sends the count and XOR of the ids it runs every ``inventory_s`` (30 s); the
manager compared it with the same aggregate over the service's Processing and OnDeleting
rows: about 120 ms of PostgreSQL per digest at 333,000 rows per service, 0.72 of the
1.06 CPU s a minute PostgreSQL spent with 1,000,000 idle (``make bench-scale``).

Kept like the counts of migration 0003: every statement that writes observers appends,
per (service_id, host_session_id) whose holding changed, the change of its count and the
XOR of the ids that entered or left it (XOR undoes itself: a row that leaves and comes back
adds nothing) to ``held_digest_deltas``; the manager folds them into ``held_digests`` every
sweep, and a digest is its ``held_digests`` row plus its pending deltas, read in one
statement. A row is held when it is Processing or OnDeleting with a service and a session:
the condition ``manager/db/digests.py`` compared over the rows.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HELD = "status IN ('Processing', 'OnDeleting') AND service_id IS NOT NULL AND host_session_id IS NOT NULL"

_FUNCTION = f"""
CREATE FUNCTION held_digest_deltas() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO held_digest_deltas (service_id, host_session_id, n, xor_hi, xor_lo)
        SELECT service_id, host_session_id, count(*), bit_xor(id_hi), bit_xor(id_lo)
        FROM new_rows WHERE {_HELD} GROUP BY 1, 2;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO held_digest_deltas (service_id, host_session_id, n, xor_hi, xor_lo)
        SELECT service_id, host_session_id, -count(*), bit_xor(id_hi), bit_xor(id_lo)
        FROM old_rows WHERE {_HELD} GROUP BY 1, 2;
    ELSE
        INSERT INTO held_digest_deltas (service_id, host_session_id, n, xor_hi, xor_lo)
        SELECT service_id, host_session_id, sum(d), bit_xor(id_hi), bit_xor(id_lo) FROM (
            SELECT service_id, host_session_id, id_hi, id_lo, 1 AS d FROM new_rows WHERE {_HELD}
            UNION ALL
            SELECT service_id, host_session_id, id_hi, id_lo, -1 AS d FROM old_rows WHERE {_HELD}
        ) AS changes
        GROUP BY 1, 2
        HAVING sum(d) <> 0 OR bit_xor(id_hi) <> 0 OR bit_xor(id_lo) <> 0;
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    for table in ("held_digests", "held_digest_deltas"):
        columns: list[sa.schema.SchemaItem] = [
            sa.Column("service_id", postgresql.UUID(as_uuid=True), nullable=False),
            sa.Column("host_session_id", postgresql.UUID(as_uuid=True), nullable=False),
            sa.Column("n", sa.BigInteger, nullable=False),
            sa.Column("xor_hi", sa.BigInteger, nullable=False),
            sa.Column("xor_lo", sa.BigInteger, nullable=False),
        ]
        if table == "held_digests":
            op.create_table(table, *columns, sa.PrimaryKeyConstraint("service_id", "host_session_id"))
        else:
            # No index: folded every sweep, it holds a few rows (one per holder and statement).
            op.create_table(table, sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True), *columns)
    op.execute(_FUNCTION)
    # Transition tables need one trigger per event.
    op.execute(
        "CREATE TRIGGER observers_digest_insert AFTER INSERT ON observers REFERENCING NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION held_digest_deltas()"
    )
    op.execute(
        "CREATE TRIGGER observers_digest_update AFTER UPDATE ON observers "
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION held_digest_deltas()"
    )
    op.execute(
        "CREATE TRIGGER observers_digest_delete AFTER DELETE ON observers REFERENCING OLD TABLE AS old_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION held_digest_deltas()"
    )
    # What is held already (the triggers keep it from now on; creating them locked the table
    # against writers until this transaction ends).
    op.execute(
        "INSERT INTO held_digests (service_id, host_session_id, n, xor_hi, xor_lo) "
        f"SELECT service_id, host_session_id, count(*), bit_xor(id_hi), bit_xor(id_lo) FROM observers "
        f"WHERE {_HELD} GROUP BY 1, 2"
    )


def downgrade() -> None:
    for event in ("insert", "update", "delete"):
        op.execute(f"DROP TRIGGER observers_digest_{event} ON observers")
    op.execute("DROP FUNCTION held_digest_deltas()")
    op.drop_table("held_digest_deltas")
    op.drop_table("held_digests")
