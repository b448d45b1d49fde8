"""a host death takes the moves of the session that died, not every move since it was heard

Probation counts as victims of a host's death the observers moved away from it since it was
last heard of (``manager/state/probation.py``). A move is recorded when its new host reports
the start, which can come after the old host, back from a network partition under the same
id, has already heartbeated in its new broker session: those moves were caused by the
earlier cut, and the host's next death counted them again (two deaths for one flap). So:

* ``services.session_id``: the broker session the service last spoke from (heartbeats,
  inventories and digests name it);
* ``observer_events.from_session_id``: on a ``moved`` event, the session of the old host
  that held the start.

Both nullable, added without a default (no table rewrite): NULL on either side, a service or
an event from before this migration, counts as before.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("services", sa.Column("session_id", postgresql.UUID(as_uuid=True), nullable=True))
    op.add_column("observer_events", sa.Column("from_session_id", postgresql.UUID(as_uuid=True), nullable=True))


def downgrade() -> None:
    op.drop_column("observer_events", "from_session_id")
    op.drop_column("services", "session_id")
