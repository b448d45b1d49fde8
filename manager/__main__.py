"""``python -m manager``: serve the API with uvicorn (host/port from ORCH_MANAGER_*).

The state process is spawned before the API's modules are imported, so the two start side by
side (``manager/state_child.py`` says why); the API's lifespan then watches it.
"""

from __future__ import annotations

from shared.logs import configure_logging
from shared.settings import get_manager_settings


def main() -> None:
    settings = get_manager_settings()
    configure_logging(settings.log_level, "manager", settings.log_format)
    child = None
    if settings.state_process:
        from manager.state_child import StateChild

        child = StateChild()
        child.spawn()
    # Imported only now, while the child imports its own half.
    import uvicorn

    from manager.app import create_app
    from shared.event_loop import uses_uvloop

    uvicorn.run(
        create_app(settings, state_child=child),
        host=settings.manager_host,
        port=settings.manager_port,
        log_config=None,
        loop="uvloop" if uses_uvloop(settings.event_loop) else "asyncio",
        access_log=False,
    )


if __name__ == "__main__":
    main()
