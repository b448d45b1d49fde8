"""The ids of the state messages applied (``applied_state_messages``): recorded in the
transaction that applies them, so a batch delivered again is skipped
(``manager/state/consumer.py``), and forgotten an hour later
(``manager/repairs/housekeeping.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.models import AppliedStateMessage

_CLAIM = text(
    """
    INSERT INTO applied_state_messages (message_id)
    SELECT unnest(CAST(:ids AS uuid[]))
    ON CONFLICT DO NOTHING
    RETURNING message_id
    """
)


async def claim(session: AsyncSession, message_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """Record ``message_ids`` as applied; returns those not recorded before."""
    return set((await session.execute(_CLAIM, {"ids": message_ids})).scalars())


async def forget_applied(session: AsyncSession, before: datetime) -> None:
    """Forget the ids applied before ``before``, a batch at most."""
    oldest = select(AppliedStateMessage.message_id).where(AppliedStateMessage.applied_at < before).limit(10_000)
    await session.execute(delete(AppliedStateMessage).where(AppliedStateMessage.message_id.in_(oldest)))
