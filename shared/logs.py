"""One log format for every process: time, level, process role, logger, message.

``ORCH_LOG_FORMAT=json`` writes one JSON object per line instead (python-json-logger), with
``role`` and, where known, ``service_id`` and ``observer_id`` as fields, for log pipelines.

A broker restart is ordinary: our code says, in its own words, that the connection was lost,
once a minute that it is still away, and that it is back (``shared.outage``: the service's
"broker session lost: ..." and "cannot open a broker session (...); retrying", the manager's
"the broker is unreachable (lost the connection: ...)" and "connected to the broker after ...").
aiormq and aio-pika log the same events as well, as ERRORs with tracebacks, once per attempt
to reconnect (docs/operations.md, "the broker down"). Those records (``_CHATTER``) are shown
only with ``ORCH_LOG_LEVEL=DEBUG``, as are two records judged by what they carry (a robust
channel failing to reopen with its connection, and the late end of a channel's close);
anything else the libraries log is kept as it is.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
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

# The libraries' records of a connection dropping or failing to open, by logger: the start
# of the message's format string (or a function of the record: ``_JUDGES``).
_CHATTER: dict[str, tuple[str, ...]] = {
    "aiormq.connection": (
        "error when creating transport",
        "Unexpected connection close from remote",
        "Cancelling cause reader exited abnormally",
    ),
    "aio_pika.robust_connection": ("Connection attempt to", "Connection to %s closed. Reconnecting"),
}
# The last record each of those loggers had kept from the log, as text: a reminder that the
# broker is still away quotes why the last attempt failed (refused, bad credentials, ...).
_last_chatter: dict[str, str] = {}
# How many each has kept: a reconnect loop that stopped trying shows as a count that stalls.
_chatter_count: dict[str, int] = {}


def last_chatter(logger_name: str) -> str | None:
    """The message of the last connection record of ``logger_name`` shown only at DEBUG."""
    return _last_chatter.get(logger_name)


def chatter_count(logger_name: str) -> int:
    """How many connection records of ``logger_name`` were kept so far."""
    return _chatter_count.get(logger_name, 0)


def _robust_channel_reopening(record: logging.LogRecord) -> int | None:
    """The level for aio-pika's record of its robust channel failing its close callback,
    None for any other record. The channel tries to reopen itself there, and fails when
    its connection is going too; it is reopened with the connection. Its error says so one
    of two ways, chatter shown at DEBUG: ``ChannelInvalidStateError`` (no transport), or,
    when the channel closed a moment before its connection (the broker closing both, as
    when a vhost is deleted: ``make bench``, broker-loss), aiormq's ``RuntimeError("<Connection:
    ...> closed")``. Any other failure to reopen (a vhost being deleted refuses the channel's
    declarations) is a WARNING: the manager tells the lost connection in its own words, and
    a channel that cannot be restored refuses requests with a 503 that says why."""
    args = record.args if isinstance(record.args, tuple) else ()
    if len(args) != 3 or "RobustChannel._on_close" not in repr(args[0]):
        return None
    text = str(args[2])
    if args[1] == "ChannelInvalidStateError" or (
        args[1] == "RuntimeError" and text.startswith("<Connection") and text.endswith(" closed")
    ):
        return logging.DEBUG
    return logging.WARNING


def _late_close_ok(record: logging.LogRecord) -> int | None:
    """DEBUG for aiormq's ERROR "Got frame for closed channel" when the frame is the broker's
    ``Channel.CloseOk``: the close handshake of a channel aiormq had already let go, ending
    (seen after a network partition heals); None for any other record."""
    message = record.msg if isinstance(record.msg, str) else ""
    args = record.args if isinstance(record.args, tuple) else ()
    if message.startswith("Got frame for closed channel") and len(args) == 2 and "Channel.CloseOk" in repr(args[1]):
        return logging.DEBUG
    return None


# The loggers whose records are judged one by one, by what they carry.
_JUDGES: dict[str, Callable[[logging.LogRecord], int | None]] = {
    "aiormq.connection": _late_close_ok,
    "aio_pika.tools": _robust_channel_reopening,
}


class _Chatter(logging.Filter):
    """Shows a library's connection chatter as DEBUG, and only when DEBUG is on; ``judge``
    may give a record another level (or None: left as it is)."""

    def __init__(self, starts: tuple[str, ...], judge: Callable[[logging.LogRecord], int | None] | None = None) -> None:
        super().__init__()
        self.starts = starts
        self.judge = judge

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg if isinstance(record.msg, str) else ""
        if message.startswith(self.starts):
            level: int | None = logging.DEBUG
        else:
            level = self.judge(record) if self.judge is not None else None
        if level is None:
            return True
        record.levelno, record.levelname = level, logging.getLevelName(level)
        if level > logging.DEBUG:
            return True
        _last_chatter[record.name] = record.getMessage()
        _chatter_count[record.name] = _chatter_count.get(record.name, 0) + 1
        return logging.getLogger().isEnabledFor(logging.DEBUG)


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
    for name in _CHATTER.keys() | _JUDGES.keys():
        _filter_once(logging.getLogger(name), _Chatter(_CHATTER.get(name, ()), _JUDGES.get(name)))


def _filter_once(logger: logging.Logger, chatter: _Chatter) -> None:
    """Configured again (a test, a restarted child): one filter per logger, not one per call."""
    logger.filters[:] = [f for f in logger.filters if not isinstance(f, _Chatter)]
    logger.addFilter(chatter)


def set_service_id(service_id: str) -> None:
    """Tag every later log record of this process with the service id (JSON logs)."""
    if _fields is not None:
        _fields.service_id = service_id
