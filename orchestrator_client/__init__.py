"""A typed Python client of the orchestrator's manager API, sync and async, on httpx.

    from orchestrator_client import Client

    with Client("http://127.0.0.1:8000", token="...") as client:
        watcher = client.create("btc-watch", "http_poll", {"url": "https://example.com/price"})
        print(client.get("btc-watch").status)     # a name wherever an id is taken
        client.stop(watcher.id)

``client`` holds ``Client``, ``aio`` ``AsyncClient`` (the same methods, awaited), ``calls``
each operation as a request plus how to read its answer and the retry rules, ``models`` the
answers as dataclasses, ``errors`` what a call raises. It imports nothing of the server and
installs with the base dependencies (``pip install .``).
"""

from orchestrator_client.aio import AsyncClient
from orchestrator_client.calls import observer_spec
from orchestrator_client.client import Client
from orchestrator_client.errors import (
    ApiError,
    Conflict,
    InvalidRequest,
    NotFound,
    OrchestratorError,
    Unauthorized,
    Unavailable,
    Unreachable,
)
from orchestrator_client.models import (
    BulkStopResult,
    Capacity,
    Event,
    History,
    Kind,
    Observer,
    Service,
    Stats,
)

__all__ = [
    "ApiError",
    "AsyncClient",
    "BulkStopResult",
    "Capacity",
    "Client",
    "Conflict",
    "Event",
    "History",
    "InvalidRequest",
    "Kind",
    "NotFound",
    "Observer",
    "OrchestratorError",
    "Service",
    "Stats",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "observer_spec",
]
