"""/healthz (the process is up) and /readyz (database and broker reachable, and the broker
checked for lost data: creates are refused until then, ``manager/repairs/rebuild.py``; services the
broker refuses are named, without making the manager unready)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from manager.db import services as service_rows
from manager.db.engine import ping

router = APIRouter(tags=["health"])

# A readiness probe answers in time or is worth nothing: a database cut off by the network
# answers nothing, and the probe would wait as long as TCP keeps trying (docs/design.md,
# invariant 14).
_DATABASE_ANSWERS_WITHIN_S = 3.0


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    checks: dict[str, str] = {}
    refused: list[tuple[str, str]] = []
    try:
        async with asyncio.timeout(_DATABASE_ANSWERS_WITHIN_S), request.app.state.read_sessions() as session:
            await ping(session)
            refused = await service_rows.refused_services(session)
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
    # A service the broker refuses is not well, but the manager is ready: creates still run
    # on the other services. So it is said here, and the answer stays 200 ("degraded").
    services = "; ".join(f"{name} cannot consume: {why}" for name, why in refused) or "ok"
    status = "unavailable" if not ready else "ok" if services == "ok" else "degraded"
    return JSONResponse({"status": status, **checks, "services": services}, status_code=200 if ready else 503)
