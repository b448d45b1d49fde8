"""Exponential backoff with equal jitter, for every loop that retries a connection.

Jitter matters as much as the doubling: a broker restart cuts every service at the same
instant, and without it a fleet retries in lockstep, hundreds of handshakes landing on the
broker together at each step while it is still starting.
"""

from __future__ import annotations

import random


def backoff_delay(failures: int, initial: float, maximum: float, spread: float | None = None) -> float:
    """Delay after ``failures`` (>= 1) failures in a row: ``initial * 2**(failures-1)`` capped
    at ``maximum``, scaled by ``0.5 + spread / 2`` (``spread`` in [0, 1], random when not
    given): equal jitter, so retries spread over the upper half of each step."""
    base = min(maximum, initial * 2.0 ** min(failures - 1, 64))
    if spread is None:
        spread = random.random()
    return base * (0.5 + spread / 2)
