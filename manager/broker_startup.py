"""The manager's first contact with the broker over TLS: a certificate either side refuses is
one CRITICAL line naming the setting to fix, and the process exits with status 2, as for a
database that refuses it (``manager/db/startup.py``).

Only with ``amqps://`` URLs, and only that: a broker that is down or unreachable is waited for
by the connection's own loop, as always (``manager/broker.py``).
"""

from __future__ import annotations

import asyncio
import logging

import aio_pika

from manager.settings import ManagerSettings
from shared.amqp_errors import amqp_tls_refusal
from shared.broker_nodes import node_name

_ANSWER_WITHIN_S = 10.0


def broker_tls_or_exit(settings: ManagerSettings, what: str, log: logging.Logger) -> None:
    """Connect once to each ``amqps://`` node; a handshake the certificates fail ends the
    process (``SystemExit(2)``); any other failure is left to the connection's loop."""

    async def check(url: str) -> str | None:
        try:
            connection = await asyncio.wait_for(
                aio_pika.connect(url, client_properties={"connection_name": f"manager: {what} checks TLS"}),
                _ANSWER_WITHIN_S,
            )
        except Exception as e:  # noqa: BLE001 - only a certificate failure is judged here
            return amqp_tls_refusal(e)
        await connection.close()
        return None

    for url in settings.broker_urls():
        if not url.startswith("amqps://"):
            continue
        refused = asyncio.run(check(url))
        if refused is not None:
            log.critical("%s cannot connect to the broker at %s: %s", what, node_name(url), refused)
            raise SystemExit(2)
