"""``python -m observer_service``: run one observer service (configured by ORCH_* variables)."""

from __future__ import annotations

import asyncio
import logging

from observer_service.service import ObserverService
from observer_service.settings import get_service_settings
from shared import amqp_frames, tracing
from shared.event_loop import loop_factory
from shared.logs import configure_logging
from shared.settings import settings_or_exit


def main() -> None:
    settings = settings_or_exit(get_service_settings)
    configure_logging(settings.log_level, f"service:{settings.service_name}", settings.log_format)
    tracing.setup("orchestrator-service")
    amqp_frames.install()
    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
            runner.run(ObserverService(settings).run())
    finally:
        tracing.shutdown()  # SIGTERM ends the run: export the spans still held
    logging.shutdown()


if __name__ == "__main__":
    main()
