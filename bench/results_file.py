"""Where every bench writes its figures: ``bench/results/<name>-<UTC time>.json``.

The folder is gitignored; a figure quoted in ``docs/`` has its file added with ``git add -f``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def stamp(started: datetime | None = None) -> str:
    """The UTC time a results file is named by: when its bench started (now by default)."""
    return (started or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


def results_path(name: str, started: datetime | None = None) -> Path:
    """The results file of the bench ``name`` started at ``started``; its folder is made."""
    RESULTS.mkdir(exist_ok=True)
    return RESULTS / f"{name}-{stamp(started)}.json"


def write_results(path: Path, document: Any) -> None:
    """Writes (or rewrites, as a long bench goes) one results file."""
    path.write_text(json.dumps(document, indent=2) + "\n")
