"""SQL helpers shared by the manager's statements."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import BindParameter, ColumnElement, Select, any_, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import InstrumentedAttribute

from manager.db.models import Observer


def id_in(column: InstrumentedAttribute[Any], ids: Iterable[uuid.UUID]) -> ColumnElement[bool]:
    """``column = ANY($1)`` with one array parameter. ``column.in_(ids)`` sends a parameter
    per id, and asyncpg refuses more than 32,767 parameters: a service's inventory or a batch
    of reports easily has more ids than that."""
    return column == any_(_uuid_array(ids))


def _uuid_array(ids: Iterable[uuid.UUID]) -> BindParameter[Any]:
    """The ids as one ``uuid[]`` parameter."""
    return bindparam(None, list(ids), type_=ARRAY(UUID(as_uuid=True)))


def lock_by_ids(columns: tuple[Any, ...], ids: Iterable[uuid.UUID]) -> Select[Any]:
    """``columns`` of the observers with these ids, locked ``FOR NO KEY UPDATE`` in id order,
    by ``id IN (SELECT unnest(ids))`` rather than ``id = ANY(ids)``.

    Why: a locking statement that finds a row changed since its snapshot rechecks that row
    (EvalPlanQual), and a recheck rescans the plan's bitmap index scans, each of which sorts
    its ``= ANY`` array again (``_bt_preprocess_array_keys``): locking k changed rows by an
    array of n ids costs k sorts of n (figures: docs/design.md, invariant 8, and
    docs/bench-history.md, "2026-11-28, eleventh session"). As a semi-join the ids are rows of
    their own, copied into a recheck, and the index is probed by one id: a recheck costs one
    probe (``tests/system/test_lock_rechecks.py``). PostgreSQL plans it as a probe per id; a
    join with ``unnest`` instead is planned as a hash of the whole table."""
    wanted = select(func.unnest(_uuid_array(ids)))
    return (
        select(*columns)
        .where(Observer.id.in_(wanted))
        .order_by(Observer.id)
        .with_for_update(key_share=True, of=Observer)
    )


def factor(items: Iterable[Any], shared: Callable[[Any], tuple[Any, ...]]) -> tuple[list[int], list[list[Any]]]:
    """Split bulk-write parameters into what varies per item and what items share.

    Returns, for each item, the 1-based number of its ``shared(item)`` tuple among the distinct
    ones, and those distinct tuples as columns: a statement joins
    ``unnest(:keys)`` to ``unnest(column, ...) WITH ORDINALITY`` on that number. The items of
    one batch of state reports share nearly everything but their ids (the same instant, the
    same event, the same new service), and asyncpg encodes every array element in Python, which
    was the largest part of a catch-up's transaction (figures: docs/bench-history.md,
    "2026-11-27, first and second sessions")."""
    numbers: dict[tuple[Any, ...], int] = {}
    keys = [numbers.setdefault(shared(item), len(numbers) + 1) for item in items]
    columns = [list(column) for column in zip(*numbers, strict=True)] if numbers else []
    return keys, columns
