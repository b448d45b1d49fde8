"""The HTTP client of the ``orchestrator`` command line: the one place for the base URL,
the token, and the mapping of failures to exit codes (1: the API refused, 3: unreachable)."""

from __future__ import annotations

import json
import ssl
from typing import Any

import httpx

JSON = Any  # an API body as httpx decodes it


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


class Client:
    def __init__(self, base_url: str, token: str | None, timeout: float, ca_file: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.has_token = bool(token)
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # An https:// manager's certificate and host name are verified: against ``ca_file``
        # (a private CA), else the CAs httpx trusts.
        verify = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, verify=verify)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: JSON = None) -> JSON:
        params = {k: v for k, v in (params or {}).items() if v is not None}  # unset filters are left out
        try:
            response = self._http.request(method, path, params=params, json=body)
        except httpx.TimeoutException as e:
            raise Unreachable(
                f"the manager at {self.base_url} did not answer within {self.timeout:g}s ({type(e).__name__})",
                "raise --timeout, or check that the manager is healthy",
            ) from e
        except httpx.TransportError as e:
            if "CERTIFICATE_VERIFY_FAILED" in str(e):
                raise Unreachable(
                    f"the manager at {self.base_url} has a certificate this client cannot verify: {e}",
                    "set --ca-file or ORCH_CA_FILE to the CA that signed it, and use a host name it holds",
                ) from e
            raise Unreachable(
                f"cannot reach the manager at {self.base_url}: {e or type(e).__name__}",
                "is it running? Set the address with --url or ORCH_URL",
            ) from e
        if response.is_error:
            raise ApiError(response.status_code, _detail(response), self._auth_hint(response.status_code))
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as e:
            raise CliError(f"the answer of {response.url} is not JSON: is {self.base_url} the manager?") from e

    def get(self, path: str, **params: Any) -> JSON:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: JSON = None) -> JSON:
        return self.request("POST", path, body=body)

    def delete(self, path: str) -> JSON:
        return self.request("DELETE", path)

    def _auth_hint(self, status_code: int) -> str | None:
        if status_code == 401:
            if self.has_token:
                return "the token was refused: check --token / ORCH_TOKEN"
            return "this manager requires a token: pass --token or set ORCH_TOKEN"
        if status_code == 403:
            return "this needs a full-access token (ORCH_API_TOKENS on the manager): check --token / ORCH_TOKEN"
        return None


def _detail(response: httpx.Response) -> str:
    """The API's ``{"detail": ...}``; a proxy or another server may answer anything else."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if detail is None:
        return response.text.strip()[:500] or response.reason_phrase
    return detail if isinstance(detail, str) else json.dumps(detail)
