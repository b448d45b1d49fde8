"""FastAPI dependencies: the shared objects live on ``app.state`` (set in the lifespan)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from manager.commands import ObserverCommands


async def _session(request: Request) -> AsyncIterator[AsyncSession]:
    """A read-only session (``make_engine(read_only=True)``): writes go through ``ObserverCommands``."""
    async with request.app.state.read_sessions() as session:
        yield session


def _commands(request: Request) -> ObserverCommands:
    commands: ObserverCommands = request.app.state.commands
    return commands


SessionDep = Annotated[AsyncSession, Depends(_session)]
CommandsDep = Annotated[ObserverCommands, Depends(_commands)]
