"""``shared.kinds``: kind references and the built-in kinds' discovery."""

from __future__ import annotations

import pytest

from shared.kinds import BUILTIN_KINDS, discover_kinds, load_ref


def test_kind_references_and_builtin_discovery() -> None:
    assert load_ref("shared.kinds.ticker:KIND") is BUILTIN_KINDS["ticker"]
    with pytest.raises(ValueError):
        load_ref("no-colon")
    with pytest.raises(TypeError):
        load_ref("shared.kinds:BUILTIN_REFS")
    assert set(BUILTIN_KINDS) <= set(discover_kinds())
