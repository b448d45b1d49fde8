"""drop the foreign key of ``observers.service_id``: every takeover changes the host of
thousands of rows at once, and the key's check ran once per row

PostgreSQL checks a changed foreign key row by row (a ``SELECT ... FOR KEY SHARE`` of the
service for each observer). Moving 6,000 observers in one ``UPDATE`` (a batch of the state
consumer during a failover) spent 39 ms of its 332 ms in those checks (``EXPLAIN ANALYZE``);
moving 333,000 in batches of 6,000 as ``manager/state/rows.py`` does took 17.5-22.1 s with the
key and 15.0-15.4 s without, twice each, against 1,000,000 observers. A failover is CPU-bound
on this project's machine, so what the database saves the broker and the services use.

Nothing is lost: services rows are never deleted (a service that leaves is marked
``deleted``), and the state rules write an observer's host only once they know the service
(``StateRules._service_in``, ``_known_or_none``).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint("observers_service_id_fkey", "observers", type_="foreignkey")


def downgrade() -> None:
    # A host the services table does not know (deleted by hand, or restored from an older
    # backup) would fail the key: forget it, as the rules do for an unknown sender; the
    # host's inventory puts its observers back on it once it introduces itself again.
    op.execute(
        "UPDATE observers o SET service_id = NULL, host_session_id = NULL "
        "WHERE service_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM services s WHERE s.id = o.service_id)"
    )
    op.create_foreign_key("observers_service_id_fkey", "observers", "services", ["service_id"], ["id"])
