"""Durations on the command line (``--run-for 90``, ``90s``, ``15m``, ``2h``, ``1d``)."""

from __future__ import annotations

import typer

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def seconds(value: str | None) -> float | None:
    """``value`` in seconds: a number, with an optional unit s, m, h or d."""
    if value is None:
        return None
    text = value.strip().lower()
    factor = _UNITS.get(text[-1:], 0)
    try:
        amount = float(text[:-1] if factor else text)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a duration such as 90, 90s, 15m, 2h or 1d") from None
    if amount <= 0:
        raise typer.BadParameter(f"{value!r}: a duration must be positive")
    return amount * (factor or 1)
