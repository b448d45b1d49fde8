"""The dashboard: a static single page (``static/``) served by the manager at ``/``.

Plain HTML, CSS and JavaScript modules with no build step and nothing fetched from elsewhere:
the page holds no data itself and reads everything from ``/api/*`` in the browser (with the
user's bearer token when the manager requires one).
"""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent / "static"
