"""SQL helpers shared by the manager's queries."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy import ColumnElement, any_, bindparam
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import InstrumentedAttribute


def id_in(column: InstrumentedAttribute[Any], ids: Iterable[uuid.UUID]) -> ColumnElement[bool]:
    """``column = ANY($1)`` with one array parameter. ``column.in_(ids)`` sends a parameter
    per id, and asyncpg refuses more than 32,767 parameters: a service's inventory or a batch
    of reports easily has more ids than that."""
    return column == any_(bindparam(None, list(ids), type_=ARRAY(UUID(as_uuid=True))))
