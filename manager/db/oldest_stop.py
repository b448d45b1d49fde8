"""How long the oldest stop still OnDeleting has waited, for ``/metrics`` and its alert
(``deploy/prometheus/alerts.yml``): the first entry of the partial index
``ix_observers_stopping`` (migration 0015), whatever the number of observers."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

_OLDEST = text(
    """
    SELECT coalesce(extract(epoch FROM now() - min(stop_requested_at)), 0)
    FROM observers WHERE status = 'OnDeleting'
    """
)


async def oldest_stop_age_s(session: AsyncSession) -> float:
    """Seconds since the oldest OnDeleting observer's stop was asked for; 0 when none is."""
    return max(0.0, float((await session.execute(_OLDEST)).scalar_one()))
