"""``python -m manager``: serve the API with uvicorn (host/port from ORCH_MANAGER_*)."""

from __future__ import annotations

import uvicorn

from manager.app import create_app
from shared.event_loop import uses_uvloop
from shared.logs import configure_logging
from shared.settings import get_manager_settings


def main() -> None:
    settings = get_manager_settings()
    configure_logging(settings.log_level, "manager", settings.log_format)
    uvicorn.run(
        create_app(settings),
        host=settings.manager_host,
        port=settings.manager_port,
        log_config=None,
        loop="uvloop" if uses_uvloop(settings.event_loop) else "asyncio",
        access_log=False,
    )


if __name__ == "__main__":
    main()
