"""``manager.db.engine``: JSONB values decode as the json module decodes them."""

from __future__ import annotations

import json

import pytest

from manager.db.engine import decode_json


@pytest.mark.parametrize(
    "document",
    [
        '{"symbol": "BTC", "interval_s": 60, "emit": true, "note": "é ✓", "big": 12345678901234567890, "x": 1.5}',
        '{"max_attempts": null, "factor": 2.0}',
        "[" * 250 + "]" * 250,  # past pydantic-core's nesting limit (200), within the json module's
        "[" * 900 + "]" * 900,
    ],
)
def test_jsonb_values_decode_as_the_json_module_decodes_them(document: str) -> None:
    assert decode_json(document) == json.loads(document)
