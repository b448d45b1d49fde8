"""The ``orchestrator`` command line's client: the typed client (``orchestrator_client``)
with its failures turned into ``CliError``s, which ``main`` reports on stderr with a hint and
turns into an exit code (1: the API refused, 3: unreachable)."""

from __future__ import annotations

from typing import Any, TypeVar

import orchestrator_client
from orchestrator_client import ApiError as ClientApiError
from orchestrator_client import OrchestratorError
from orchestrator_client import Unreachable as ClientUnreachable
from orchestrator_client.calls import Call

JSON = Any  # an API body as the client's models decode it (orchestrator_client.models.to_json)
T = TypeVar("T")

_UNREACHABLE_HINTS = {
    "timeout": "raise --timeout, or check that the manager is healthy",
    "certificate": "set --ca-file or ORCH_CA_FILE to the CA that signed it, and use a host name it holds",
    "connect": "is it running? Set the address with --url or ORCH_URL",
}


class CliError(Exception):
    """A failure to report on stderr and turn into an exit code (in ``main``)."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ApiError(CliError):
    def __init__(self, status_code: int, detail: str, hint: str | None = None) -> None:
        super().__init__(f"HTTP {status_code}: {detail}", hint)
        self.status_code = status_code
        self.detail = detail


class Unreachable(CliError):
    exit_code = 3


class Client(orchestrator_client.Client):
    def __init__(self, url: str, token: str | None, timeout: float, ca_file: str | None, retries: int) -> None:
        super().__init__(url, token, timeout=timeout, ca_file=ca_file, retries=retries)
        self.has_token = bool(token)

    def send(self, call: Call[T]) -> T:
        try:
            return super().send(call)
        except ClientUnreachable as e:
            raise Unreachable(str(e), _UNREACHABLE_HINTS.get(e.reason)) from e
        except ClientApiError as e:
            raise ApiError(e.status_code, e.detail, self._auth_hint(e.status_code)) from e
        except OrchestratorError as e:
            raise CliError(str(e)) from e

    def _auth_hint(self, status_code: int) -> str | None:
        if status_code == 401:
            if self.has_token:
                return "the token was refused: check --token / ORCH_TOKEN"
            return "this manager requires a token: pass --token or set ORCH_TOKEN"
        if status_code == 403:
            return "this needs a full-access token (ORCH_API_TOKENS on the manager): check --token / ORCH_TOKEN"
        return None
