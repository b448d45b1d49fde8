"""Queries by service: which observers a service runs, read through ``observer_hosts``.

``observers.service_id`` has no index (migration 0011): a failover or a fleet restart
changes it for every moved row, and an indexed column would make PostgreSQL write each moved
row anew with an entry in every index of the table instead of updating it in place. The
triggers of that migration mirror it, in the statement that changes it, in
``observer_hosts (observer_id, service_id)``, indexed by service: that table (named before
"host" meant only a machine) is what a query by service reads.
``tests/system/test_observer_hosts.py`` checks the mirror after every kind of write.
"""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, select
from sqlalchemy.ext.asyncio import AsyncSession

from manager.db.models import Observer, ObserverHost


def on_service(service_id: uuid.UUID) -> ColumnElement[bool]:
    """``Observer.service_id == service_id``, found through the service's index in
    ``observer_hosts`` rather than by reading every observer row.

    As ``id IN (SELECT ...)``: alone it is a join on the primary key. ORed with other
    conditions (an inventory's query asks for its listed ids or the service's rows), PostgreSQL
    reads every observer row instead (figures: docs/bench-history.md, "2026-11-27, ninth
    session"): such a query takes :func:`ids_on` instead. The column is compared too: the
    mirror is exact, but the condition then says what it means wherever it is used."""
    mirrored = select(ObserverHost.observer_id).where(ObserverHost.service_id == service_id)
    return Observer.id.in_(mirrored) & (Observer.service_id == service_id)


async def ids_on(session: AsyncSession, service_id: uuid.UUID) -> list[uuid.UUID]:
    """The ids of the observers ``service_id`` runs, as the rows stand in this transaction.
    For a query that ORs the service's rows with other conditions: ``id_in`` of these ids is an
    index condition on the primary key, so the OR is a BitmapOr of index scans. Neither
    ``on_service``'s subquery nor ``id = ANY(ARRAY(SELECT ...))`` is: when the planner chooses
    to read every row, the array's ids are compared one by one with each (figures: the same
    session)."""
    return list(await session.scalars(select(ObserverHost.observer_id).where(ObserverHost.service_id == service_id)))
