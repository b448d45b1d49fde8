"""``manager.db.observers``: the list cursor round-trips and garbage is refused."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from manager.db.observers import decode_cursor, encode_cursor
from manager.errors import Invalid


def test_cursor_round_trip_and_garbage() -> None:
    now, oid = datetime.now(UTC), uuid.uuid4()
    assert decode_cursor(encode_cursor(now, oid)) == (now, oid)
    with pytest.raises(Invalid, match="cursor"):
        decode_cursor("garbage!")
