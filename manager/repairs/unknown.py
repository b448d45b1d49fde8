"""Observers reported running that have no row, after ``ORCH_UNKNOWN_GRACE_S`` (a create's
commit may be in flight): their service is asked for their starts, to adopt them
(``manager/state/adoption.py``), or asked to report again when the row turned up."""

from __future__ import annotations

import logging
import time
import uuid

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.db import observers
from manager.repairs.base import Repair
from manager.state.context import StateContext
from shared.messages import STOPS_PER_MESSAGE, DescribeRequest, InventoryRequest

logger = logging.getLogger(__name__)


class DescribeUnknown(Repair):
    name = "describe_unknown"

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], broker: BrokerLink, context: StateContext, grace_s: float
    ) -> None:
        self.sessions = sessions
        self.broker = broker
        self.unknown = context.suspicions.unknown  # observer -> (service, first seen), kept by the rules
        self.grace_s = grace_s

    async def run(self) -> None:
        due = [(oid, sid) for oid, (sid, seen) in list(self.unknown.items()) if time.monotonic() - seen >= self.grace_s]
        if not due:
            return
        async with self.sessions() as session:
            known = await observers.existing_ids(session, [oid for oid, _ in due])
        orphans: dict[uuid.UUID, list[uuid.UUID]] = {}  # service -> observers with no row
        recheck: set[uuid.UUID] = set()
        for oid, sid in due:
            del self.unknown[oid]
            if oid in known:
                recheck.add(sid)  # its row committed after the report: ask the service to report again
            else:
                orphans.setdefault(sid, []).append(oid)
        for sid in recheck:
            await self.broker.publish_control(InventoryRequest(service_id=sid))
        # Batched per service: a database restored from an older backup leaves thousands at once.
        for sid, oids in orphans.items():
            logger.warning(
                "%d observer(s) run on %s but have no row (e.g. %s): asking it to describe them, to adopt them",
                len(oids),
                sid,
                oids[0],
            )
            for i in range(0, len(oids), STOPS_PER_MESSAGE):
                await self.broker.publish_control(
                    DescribeRequest(service_id=sid, observer_ids=oids[i : i + STOPS_PER_MESSAGE])
                )
