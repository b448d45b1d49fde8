"""``/`` and ``/static/<file>``: the dashboard's files (``manager/dashboard/static``).

Public on purpose (see ``manager.api.auth``): the files carry no data; the page asks ``/api/*``
for everything with the user's token. Only files that ship in the package are served, by an
exact name lookup, so no path can escape the folder. A strict Content-Security-Policy keeps the
page from loading or sending anything anywhere but this manager.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

from manager.dashboard import STATIC_DIR

router = APIRouter(tags=["dashboard"], include_in_schema=False)

_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
_HEADERS = {
    # Polling a new manager version must not run a cached old page against a changed API.
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
}


def _files(folder: Path) -> dict[str, Path]:
    """Servable files by name, fixed when the manager starts (the package does not change)."""
    if not folder.is_dir():
        return {}
    return {p.name: p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix in _MEDIA_TYPES}


_FILES = _files(STATIC_DIR)


def _serve(name: str) -> FileResponse:
    path = _FILES.get(name)
    if path is None:
        raise HTTPException(status_code=404, detail=f"no dashboard file {name!r}")
    return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix], headers=_HEADERS)


@router.get("/")
async def index() -> FileResponse:
    return _serve("index.html")


@router.get("/static/{name}")
async def static_file(name: str) -> FileResponse:
    return _serve(name)
