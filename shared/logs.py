"""One log format for every process: time, level, process role, logger, message.

``ORCH_LOG_FORMAT=json`` writes one JSON object per line instead (python-json-logger), with
``role`` and, where known, ``service_id`` and ``observer_id`` as fields, for log pipelines.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

from pythonjsonlogger.json import JsonFormatter

LogFormat = Literal["text", "json"]


class _Fields(logging.Filter):
    """Adds the process-wide fields (role, service id) to every record."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role
        self.service_id: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = self.role
        if self.service_id is not None and not hasattr(record, "service_id"):
            record.service_id = self.service_id
        return True


_fields: _Fields | None = None


def configure_logging(level: str, role: str, log_format: LogFormat = "text") -> None:
    global _fields
    handler = logging.StreamHandler(sys.stderr)
    _fields = _Fields(role)
    handler.addFilter(_fields)
    if log_format == "json":
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(role)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(role)s] %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiormq").setLevel(logging.WARNING)
    logging.getLogger("aio_pika").setLevel(logging.WARNING)


def set_service_id(service_id: str) -> None:
    """Tag every later log record of this process with the service id (JSON logs)."""
    if _fields is not None:
        _fields.service_id = service_id
