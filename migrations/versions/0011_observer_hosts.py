"""moves as updates in place: an observer's host is looked up in ``observer_hosts``, kept by
triggers, so no index of ``observers`` covers a column a move changes

A failover or a fleet restart changes each moved row's ``service_id``, ``host_session_id``,
``attempts`` and ``modified_at``. ``service_id`` and ``attempts`` were indexed, so PostgreSQL
wrote every moved row anew with an entry in six of the table's seven indexes. Now:

* ``service_id`` is mirrored, for every row that has one, in ``observer_hosts``
  ``(observer_id, service_id)``, kept by statement triggers from the transition tables (as
  the held digests of migration 0008 are): a move costs that narrow table one deleted row
  and one new one, and every query by host reads its index on the host
  (``manager.db.hosts.hosted_on``);
* a move no longer counts as an attempt (``manager/state/rules.py``: only the first start of
  a life and the retries after the observer's own failures do), so ``attempts`` stays put;
* ``observers`` keeps 30 % of each page free (fillfactor 70) for the new version of a moved
  row. Pages written before this migration get that room as their rows are pruned; the
  table is not rewritten here, which would lock it for as long as the copy takes.

With no indexed column changed and room on its page, PostgreSQL updates a moved row in place
(a HOT update: no index entry at all). What that gains, and what the second table costs:
``docs/bench-history.md``, the eighth and ninth sessions of 2026-11-27.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Two plans the function keeps PostgreSQL from (auto_explain and psql):
# * A scan of every key per statement. Keys are deleted by id (``observer_id = ANY(ids)``),
#   and sequential scans are off while the function runs: the planner, which prices an index
#   probe as a disk read, scanned all of observer_hosts to delete 700 keys (27 of the
#   trigger's 38 ms at 40,000 rows; a million rows per statement at 1,000,000). Reading a
#   transition table is not a sequential scan in that sense.
# * A plan kept for the connection. PL/pgSQL plans a statement once per connection: the join
#   of the transition tables, planned for a move of one row (a nested loop), then compared
#   every old row with every new one in each later move (3.7 s instead of 0.2 s for 5,000
#   rows after one; 100 to 610 ms per state batch in make bench's failover). It runs by
#   EXECUTE, planned for each statement.
_FUNCTION = """
CREATE FUNCTION observer_hosts_sync() RETURNS trigger LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    new_hosts uuid[];
    ids uuid[];
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO observer_hosts (observer_id, service_id)
        SELECT id, service_id FROM new_rows WHERE service_id IS NOT NULL;
    ELSIF TG_OP = 'DELETE' THEN
        DELETE FROM observer_hosts WHERE observer_id = ANY(ARRAY(SELECT id FROM old_rows WHERE service_id IS NOT NULL));
    ELSE
        -- Only rows whose host changed: most updates (a status, an error) leave it.
        EXECUTE 'SELECT array_agg(n.id), array_agg(n.service_id) '
                'FROM old_rows o JOIN new_rows n ON n.id = o.id '
                'WHERE o.service_id IS DISTINCT FROM n.service_id'
        INTO ids, new_hosts;
        IF ids IS NOT NULL THEN
            DELETE FROM observer_hosts WHERE observer_id = ANY(ids);
            INSERT INTO observer_hosts (observer_id, service_id)
            SELECT id, host FROM unnest(ids, new_hosts) AS m(id, host) WHERE host IS NOT NULL;
        END IF;
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "observer_hosts",
        sa.Column("observer_id", postgresql.UUID(as_uuid=True), primary_key=True),
        sa.Column("service_id", postgresql.UUID(as_uuid=True), nullable=False),
    )
    # Both columns: a host's observers are read from the index alone.
    op.create_index("ix_observer_hosts_service", "observer_hosts", ["service_id", "observer_id"])
    op.execute(_FUNCTION)
    # Transition tables need one trigger per event.
    op.execute(
        "CREATE TRIGGER observers_hosts_insert AFTER INSERT ON observers REFERENCING NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION observer_hosts_sync()"
    )
    op.execute(
        "CREATE TRIGGER observers_hosts_update AFTER UPDATE ON observers "
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION observer_hosts_sync()"
    )
    op.execute(
        "CREATE TRIGGER observers_hosts_delete AFTER DELETE ON observers REFERENCING OLD TABLE AS old_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION observer_hosts_sync()"
    )
    # What is hosted already (creating the triggers locked the table against writers until
    # this transaction ends, so nothing changes in between).
    op.execute(
        "INSERT INTO observer_hosts (observer_id, service_id) "
        "SELECT id, service_id FROM observers WHERE service_id IS NOT NULL"
    )
    op.drop_index("ix_observers_service", table_name="observers")
    op.execute("ALTER TABLE observers SET (fillfactor = 70)")


def downgrade() -> None:
    op.execute("ALTER TABLE observers RESET (fillfactor)")
    op.create_index("ix_observers_service", "observers", ["service_id"])
    for event in ("insert", "update", "delete"):
        op.execute(f"DROP TRIGGER observers_hosts_{event} ON observers")
    op.execute("DROP FUNCTION observer_hosts_sync()")
    op.drop_table("observer_hosts")
