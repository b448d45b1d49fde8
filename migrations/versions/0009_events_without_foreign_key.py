"""drop the foreign key of ``observer_events.observer_id``: history is written by the hundred
thousand, and the key's check doubled the cost of every event

PostgreSQL checks a foreign key by locking the referenced row (``FOR KEY SHARE``), which
writes the row's header and a WAL record per event. A host death at 1,000,000 writes 333,000
``host_lost`` events, and the failover that follows a ``moved`` event per observer: inserting
333,000 events took 4.0-4.3 s and 159 MiB of WAL with the key, 2.1-2.2 s and 94 MiB without
(``INSERT ... SELECT FROM unnest``, as ``manager/db/events.py`` does, against 333,000 observers).
Observer rows are deleted in one place only (a create refused after its rows were written,
``manager/commands.py``), which deletes their events itself.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint("observer_events_observer_id_fkey", "observer_events", type_="foreignkey")


def downgrade() -> None:
    # Events whose observer is gone (none are written, but a downgrade must not fail on them).
    op.execute("DELETE FROM observer_events e WHERE NOT EXISTS (SELECT 1 FROM observers o WHERE o.id = e.observer_id)")
    op.create_foreign_key(
        "observer_events_observer_id_fkey", "observer_events", "observers", ["observer_id"], ["id"], ondelete="CASCADE"
    )
