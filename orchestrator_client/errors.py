"""What a call of the client raises: every failure is an ``OrchestratorError``; an answer of
the API with an error status is an ``ApiError`` carrying the API's ``detail`` (which says
what to fix), refined by status so callers catch what they can handle."""

from __future__ import annotations


class OrchestratorError(Exception):
    """Any failure of a client call."""


class Unreachable(OrchestratorError):
    """No answer: the manager could not be reached, did not answer in time, or its
    certificate could not be verified (after the client's retries); ``reason`` says which:
    ``connect``, ``timeout`` or ``certificate``."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ApiError(OrchestratorError):
    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"HTTP {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class InvalidRequest(ApiError):
    """400, 413, 422: the request is wrong; ``detail`` names every field to fix."""


class Unauthorized(ApiError):
    """401 (no token, or an unknown one) or 403 (a read-only token tried to change something)."""


class NotFound(ApiError):
    """404: no such observer or service."""


class Conflict(ApiError):
    """409: the name is in use by another observer, it is already final, not Failed (restart)
    or no longer Scheduled (reschedule)."""


class Unavailable(ApiError):
    """503 still, after the client waited its ``Retry-After`` as many times as it may: no
    capacity or no live service in the pool, or the manager's broker or database is away."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: InvalidRequest,
    422: InvalidRequest,
    503: Unavailable,
}


def api_error(status_code: int, detail: str) -> ApiError:
    return _BY_STATUS.get(status_code, ApiError)(status_code, detail)
