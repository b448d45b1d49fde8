"""Bearer tokens for ``/api/*``.

``ORCH_API_TOKENS`` may do everything, ``ORCH_API_READ_TOKENS`` may only read (GET). With
neither set the API is open and the manager says so loudly at start. Tokens are compared in
constant time, against every configured token, so the answer time says nothing about which
prefix matched. ``/``, ``/static``, ``/healthz``, ``/readyz`` and ``/metrics`` stay public:
they carry no observer data that a token would protect (``/metrics`` has counts only).
"""

from __future__ import annotations

import hmac
import logging
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from manager.errors import ManagerError
from manager.settings import ManagerSettings

logger = logging.getLogger(__name__)

_bearer = HTTPBearer(auto_error=False, description="a token from ORCH_API_TOKENS (or ORCH_API_READ_TOKENS for GET)")
_READS = frozenset({"GET", "HEAD", "OPTIONS"})


class Unauthorized(ManagerError):
    status_code = 401


class Forbidden(ManagerError):
    status_code = 403


def _matches(token: str, candidates: list[str]) -> bool:
    found = False
    for candidate in candidates:  # no early exit: constant time over the whole list
        found |= hmac.compare_digest(token.encode(), candidate.encode())
    return found


async def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    settings: ManagerSettings = request.app.state.settings
    if not settings.api_tokens and not settings.api_read_tokens:
        return
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise Unauthorized("missing token: send the header 'Authorization: Bearer <token>' (see ORCH_API_TOKENS)")
    token = credentials.credentials
    if _matches(token, settings.api_tokens):
        return
    if _matches(token, settings.api_read_tokens):
        if request.method in _READS:
            return
        raise Forbidden("this token is read-only: changing observers needs a token from ORCH_API_TOKENS")
    raise Unauthorized("invalid token")


def warn_if_open(settings: ManagerSettings) -> None:
    if not settings.api_tokens and not settings.api_read_tokens:
        logger.warning(
            "THE API IS OPEN: no ORCH_API_TOKENS configured, anyone who can reach port %d may create and "
            "stop observers",
            settings.manager_port,
        )
