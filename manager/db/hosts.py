"""Queries by host: which observers a service hosts, read through ``observer_hosts``.

``observers.service_id`` has no index (migration 0011): a failover or a fleet restart
changes it for every moved row, and an indexed column would make PostgreSQL write each moved
row anew with an entry in every index of the table instead of updating it in place. The
triggers of that migration mirror it, in the statement that changes it, in
``observer_hosts (observer_id, service_id)``, indexed by host: that table is what a query by
host reads. ``tests/test_observer_hosts.py`` checks the mirror after every kind of write.
"""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, any_, func, select

from manager.db.models import Observer, ObserverHost


def hosted_on(service_id: uuid.UUID) -> ColumnElement[bool]:
    """``Observer.service_id == service_id``, found through the host's index in
    ``observer_hosts`` rather than by reading every observer row.

    As ``id = ANY(ARRAY(SELECT ...))``, not ``id IN (SELECT ...)``: the array is read once and
    the condition is an index condition on the primary key, which PostgreSQL can OR with
    others (an inventory's query asks for its listed ids or the host's rows); a subquery in
    an OR made it scan every observer row. The column is compared too: the mirror is exact,
    but the condition then says what it means wherever it is used."""
    mirrored = select(ObserverHost.observer_id).where(ObserverHost.service_id == service_id).scalar_subquery()
    return (Observer.id == any_(func.array(mirrored))) & (Observer.service_id == service_id)
