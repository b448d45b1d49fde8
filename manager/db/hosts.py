"""Queries by host: which observers a service hosts, read through ``observer_hosts``.

``observers.service_id`` has no index (migration 0011): a failover or a fleet restart
changes it for every moved row, and an indexed column would make PostgreSQL write each moved
row anew with an entry in every index of the table instead of updating it in place. The
triggers of that migration mirror it, in the statement that changes it, as the key
``(service_id, observer_id)`` of ``observer_hosts``: that table is what a query by host
reads. ``tests/test_observer_hosts.py`` checks the mirror after every kind of write.
"""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, select

from manager.db.models import Observer, ObserverHost


def hosted_on(service_id: uuid.UUID) -> ColumnElement[bool]:
    """``Observer.service_id == service_id``, found through ``observer_hosts``'s key rather
    than by reading every observer row. The column is compared too: the mirror is exact, but
    the condition then says what it means wherever it is used."""
    mirrored = select(ObserverHost.observer_id).where(ObserverHost.service_id == service_id)
    return Observer.id.in_(mirrored) & (Observer.service_id == service_id)
