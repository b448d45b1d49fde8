"""SQL helpers shared by the manager's queries."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import ColumnElement, any_, bindparam
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import InstrumentedAttribute


def id_in(column: InstrumentedAttribute[Any], ids: Iterable[uuid.UUID]) -> ColumnElement[bool]:
    """``column = ANY($1)`` with one array parameter. ``column.in_(ids)`` sends a parameter
    per id, and asyncpg refuses more than 32,767 parameters: a service's inventory or a batch
    of reports easily has more ids than that."""
    return column == any_(bindparam(None, list(ids), type_=ARRAY(UUID(as_uuid=True))))


def factor(items: Iterable[Any], shared: Callable[[Any], tuple[Any, ...]]) -> tuple[list[int], list[list[Any]]]:
    """Split bulk-write parameters into what varies per item and what items share.

    Returns, for each item, the 1-based number of its ``shared(item)`` tuple among the distinct
    ones, and those distinct tuples as columns: a statement joins
    ``unnest(:keys)`` to ``unnest(column, ...) WITH ORDINALITY`` on that number. The items of
    one batch of state reports share nearly everything but their ids (the same instant, the
    same event, the same new host), and asyncpg encodes every array element in Python: in the
    ``make bench`` catch-up, writing 60,000 events as six arrays of 60,000 was the largest
    part of the state process's CPU in its one transaction (py-spy)."""
    numbers: dict[tuple[Any, ...], int] = {}
    keys = [numbers.setdefault(shared(item), len(numbers) + 1) for item in items]
    columns = [list(column) for column in zip(*numbers, strict=True)] if numbers else []
    return keys, columns
