"""When a service may go back to its home node (``shared/broker_nodes.py``, issue 65).

A failure moves a service's session to the next node of the cluster, and nothing moved it
back: after a rolling restart of the brokers every service sat on the node restarted last,
and that node's death then silenced the whole fleet at once instead of a third of it. So a
service connected elsewhere watches its home node and moves back once the node is back.

*Back* means the home node confirms a publish to the lease queue, as the lease's own round
trip does (``holding.py``): a confirm means a majority of the cluster took the write, and a
node cut off from the others answers a connect but never confirms. It must confirm at every
probe for a while, drawn at random between ``after_s`` and twice that, so that the services
of one node do not all move in the same second and a node that flaps is not followed.

What the caller does then costs each of the service's observers one restart: a delivery
belongs to the channel it came on, and no broker can move it to a connection to another
node, so the service hands its observers over (``ObserverService._return_home``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

import aio_pika
import aiormq

from shared import topology
from shared.broker_nodes import node_name

logger = logging.getLogger(__name__)

# A probe that takes longer than this counts as a failure.
_PROBE_TIMEOUT_S = 5.0


async def until_back(url: str, connection_name: str, after_s: float) -> None:
    """Until the node at ``url`` has confirmed every probe for ``after_s`` times a random 1 to 2."""
    steady_s = after_s * random.uniform(1, 2)
    every_s = min(5.0, max(0.25, after_s / 4))
    since: float | None = None
    while True:
        if await confirms(url, connection_name):
            if since is None:
                since = time.monotonic()
                logger.info(
                    "home broker node %s confirms writes again: moving back there if it keeps doing so for %.0fs",
                    node_name(url),
                    steady_s,
                )
            if time.monotonic() - since >= steady_s:
                return
        else:
            since = None
        await asyncio.sleep(every_s)


async def confirms(url: str, connection_name: str) -> bool:
    """Whether the node at ``url`` confirms a publish to the lease queue now."""
    try:
        async with asyncio.timeout(_PROBE_TIMEOUT_S):
            connection = await aio_pika.connect(url, client_properties={"connection_name": connection_name})
            try:
                channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
                message = aio_pika.Message(b"")
                await channel.default_exchange.publish(message, routing_key=topology.LEASE_QUEUE, mandatory=True)
            finally:
                await connection.close()
    except (OSError, aiormq.exceptions.AMQPError) as e:  # down, refusing, cut off (no confirm in time, TimeoutError)
        logger.debug("home broker node %s does not confirm: %r", node_name(url), e)
        return False
    return True
