"""fleet reliability: the host's session on each observer, probation, applied state messages

* ``observers.host_session_id``: the broker session of the host that holds the observer's
  start. A stop aimed at one copy names it, so a late stop never hits a newer copy on the
  same host (issue 11).
* ``observers.probation_since`` / ``probation_clean_since``: an observer whose hosts died
  too often runs in a child process of its own until it has run cleanly for its retry
  policy's ``reset_after_s`` (``manager/state/probation.py``).
* ``applied_state_messages``: ids of the state messages already applied, written in the
  same transaction, so a batch delivered again (a manager killed after its commit, before
  its ack) is not applied twice.
* ``observers.life``: how many times it was restarted after Failed. Starts and broadcast
  stops carry it, so a service compares a remembered stop with a later start by life, not by
  the wall clocks of possibly different managers.
* ``abandoned_observers``: ids of observers whose create was answered 503 and whose rows
  were deleted, while some of their starts may have been published: found running, they
  are stopped, not adopted (``manager/state/adoption.py``).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("observers", sa.Column("host_session_id", postgresql.UUID(as_uuid=True), nullable=True))
    op.add_column("observers", sa.Column("life", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("observers", sa.Column("probation_since", sa.DateTime(timezone=True), nullable=True))
    op.add_column("observers", sa.Column("probation_clean_since", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_observers_probation",
        "observers",
        ["probation_since"],
        postgresql_where=sa.text("probation_since IS NOT NULL"),
    )
    op.create_table(
        "applied_state_messages",
        sa.Column("message_id", postgresql.UUID(as_uuid=True), primary_key=True),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_applied_state_messages_at", "applied_state_messages", ["applied_at"])
    op.create_table(
        "abandoned_observers",
        sa.Column("observer_id", postgresql.UUID(as_uuid=True), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_abandoned_observers_at", "abandoned_observers", ["at"])


def downgrade() -> None:
    op.drop_index("ix_abandoned_observers_at", table_name="abandoned_observers")
    op.drop_table("abandoned_observers")
    op.drop_index("ix_applied_state_messages_at", table_name="applied_state_messages")
    op.drop_table("applied_state_messages")
    op.drop_index("ix_observers_probation", table_name="observers")
    op.drop_column("observers", "probation_clean_since")
    op.drop_column("observers", "probation_since")
    op.drop_column("observers", "life")
    op.drop_column("observers", "host_session_id")
