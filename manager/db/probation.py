"""The statements of probation (``manager/state/probation.py`` holds the policy): the record
of host deaths (``host_deaths``)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.models import HostDeath


async def forget_deaths(session: AsyncSession, before: datetime) -> None:
    """Delete the record of the host deaths before ``before``."""
    await session.execute(delete(HostDeath).where(HostDeath.at < before))
