"""/api/history: the dashboard's charts of the last hour (``manager/history/``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from manager.api.schemas import ERRORS
from manager.history.sampler import Sampler

router = APIRouter(prefix="/api", tags=["services"], responses=ERRORS)


class ServiceLoadSeries(BaseModel):
    id: str
    name: str
    running: list[int | None] = Field(description="observers it ran at each sample; null: not alive then")
    workers: list[int | None] = Field(description="its workers at each sample; null: not alive then")


class PerMinute(BaseModel):
    at: list[float] = Field(description="start of each minute (Unix seconds)")
    created: list[int] = Field(description="observers created in that minute")
    stopped: list[int] = Field(description="observers that reached Deleted")
    failed: list[int] = Field(description="observers that reached Failed")
    failovers: list[int] = Field(description="observers taken over by another service (`moved` events)")


class HistoryOut(BaseModel):
    period_s: float = Field(description="seconds between samples (ORCH_HISTORY_SAMPLE_S)")
    window_s: float = Field(description="how far back the samples go")
    at: list[float] = Field(description="when each sample was taken (Unix seconds), oldest first")
    observers: dict[str, list[int]] = Field(description="observers per status at each sample")
    services: list[ServiceLoadSeries] = Field(description="each service alive at some sample, by name")
    per_minute: PerMinute


@router.get("/history", response_model=HistoryOut)
async def get_history(request: Request) -> dict[str, Any]:
    """The last hour as this manager sampled it since it started (kept in its memory)."""
    sampler: Sampler = request.app.state.history
    return sampler.history.as_json()
