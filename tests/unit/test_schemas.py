"""``manager.api.schemas``: list rows sharing one stored retry policy share one model."""

from __future__ import annotations

from typing import Any

from manager.api.schemas import _retry_policy
from shared.messages import (
    RetryPolicy,
)


def test_list_rows_with_one_stored_retry_policy_share_one_model() -> None:
    stored: dict[str, Any] = {"max_attempts": None, "initial_delay_s": 1.0, "factor": 2.0, "jitter": 0.1}
    first, second = _retry_policy(dict(stored)), _retry_policy(dict(stored))
    other = _retry_policy(stored | {"max_attempts": 3})
    assert first is second
    assert first == RetryPolicy.model_construct(**stored)
    assert other is not first and other is not None and other.max_attempts == 3
    assert _retry_policy(None) is None
