"""/healthz (the process is up) and /readyz (database and broker reachable, and the broker
checked for lost data: creates are refused until then, ``manager/rebuild.py``)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

router = APIRouter(tags=["health"])

# A readiness probe answers in time or is worth nothing: a database cut off by the network
# answers nothing, and the probe once waited as long as TCP kept trying (over a minute).
_DATABASE_ANSWERS_WITHIN_S = 3.0


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    checks: dict[str, str] = {}
    try:
        async with asyncio.timeout(_DATABASE_ANSWERS_WITHIN_S), request.app.state.read_sessions() as session:
            await session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except TimeoutError:
        checks["database"] = f"no answer within {_DATABASE_ANSWERS_WITHIN_S:g}s"
    except Exception as e:  # noqa: BLE001 - report, never raise
        checks["database"] = f"unreachable: {type(e).__name__}"
    broker = request.app.state.broker
    if not broker.is_connected():
        checks["broker"] = "unreachable"
    else:
        checks["broker"] = "ok" if await broker.checked() else "being rebuilt from the database"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ok" if ready else "unavailable", **checks}, status_code=200 if ready else 503)
