"""``python -m manager``: serve the API with uvicorn (host/port from ORCH_MANAGER_*).

The state process is spawned first, before this process imports the API's modules or even
its settings, so the two start side by side (``manager/state/supervisor.py`` says why); the API's
lifespan then watches it.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from manager.state.supervisor import StateSupervisor

logger = logging.getLogger("manager")  # not "__main__" when run with -m


def main() -> None:
    child = None
    if _state_process_by_default():
        # Before the settings: importing them (pydantic and the messages' models) took about
        # 0.5 s of this machine's core before the spawn, and a restarted manager's backlog
        # waits for the state process alone (python -m bench.manager_start). A settings error
        # stops this process below, and the child with it (it dies with its parent).
        child = _spawn_state_process()

    from manager.settings import get_manager_settings
    from shared.logs import configure_logging
    from shared.settings import settings_or_exit

    settings = settings_or_exit(get_manager_settings)
    configure_logging(settings.log_level, "manager", settings.log_format)
    from shared import tracing

    if tracing.setup("orchestrator-manager"):
        tracing.instrument_asyncpg()
    from shared import amqp_frames

    amqp_frames.install()
    if child is not None:
        logger.info("state process started (pid %s) before the settings were read", child.pid)
    elif settings.state_process:
        child = _spawn_state_process()
    # Imported only now, while the child imports its own half.
    from manager.db.startup import database_ready_or_exit

    database_ready_or_exit(settings, "the API", logger)  # waits for it; refused: status 2
    from manager.broker_startup import broker_tls_or_exit

    broker_tls_or_exit(settings, "the API", logger)  # a certificate refused: status 2
    import uvicorn

    from manager.app import create_app
    from shared.event_loop import uses_uvloop

    try:
        uvicorn.run(
            create_app(settings, state_supervisor=child),
            host=settings.manager_host,
            port=settings.manager_port,
            log_config=None,
            loop="uvloop" if uses_uvloop(settings.event_loop) else "asyncio",
            access_log=False,
            ssl_certfile=settings.manager_tls_cert_file,  # HTTPS when set
            ssl_keyfile=settings.manager_tls_key_file,
        )
    finally:
        tracing.shutdown()  # uvicorn returns on SIGTERM: export the spans still held


def _spawn_state_process() -> StateSupervisor:
    from manager.state.supervisor import StateSupervisor

    child = StateSupervisor()
    child.spawn()
    return child


def _state_process_by_default() -> bool:
    """Whether ``ORCH_STATE_PROCESS`` is absent (its default: true) under any case, as the
    settings read names. A value that is set is left to the settings to parse, and the
    child is spawned after them, as before."""
    return not any(name.upper() == "ORCH_STATE_PROCESS" for name in os.environ)


if __name__ == "__main__":
    main()
