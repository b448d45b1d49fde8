"""Domain errors of the manager, mapped to HTTP in one place (``manager.api``)."""

from __future__ import annotations


class ManagerError(Exception):
    status_code = 400

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFound(ManagerError):
    status_code = 404


class Conflict(ManagerError):
    status_code = 409


class Invalid(ManagerError):
    status_code = 422


class Unavailable(ManagerError):
    """No capacity, or the broker or the database is unreachable: try again later."""

    status_code = 503


class NoCapacity(Unavailable):
    """A pool has no live service, or too few free workers for a create."""


# Seconds a client is told to wait (``Retry-After``) with every 503: about what the manager
# needs to notice that the broker or the database is back (both reconnect within seconds).
RETRY_AFTER_S = 5
