"""Whether a start queue this session holds starts from was deleted (issue 62, items 6 and 10).

Deleting a queue drops its messages, the ones consumers hold unacked too: the starts of every
observer this session runs from it are gone, and nothing would ever publish them again but
the manager's slow lost-start repair (131 s seen). So the service tells the manager which
starts died with the queue (``StartsGone``), and the manager publishes them again at once.

That must be said only when the queue was truly deleted: a start published again while the
first copy still exists would run twice. The broker's ``basic.cancel`` carries no reason (a
deleted queue, a quorum queue's consumer timeout, a classic queue whose node went down), so a
passive declare settles it: "no queue" is a deletion; a 404 that says the queue's home node
is down is not (its messages come back with the node), nor is anything else.

A service that consumes nothing (cordoned: a drain) gets no ``basic.cancel`` at all, and its
held deliveries vanish silently (a later nack or ack of them does nothing). So while it does
not consume, the holding connection asks about each of its pools' queues every
``WATCH_EVERY_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiormq
from aio_pika.abc import AbstractConnection

logger = logging.getLogger(__name__)

WATCH_EVERY_S = 3.0
_ASK_WITHIN_S = 5.0


async def deleted(connection: AbstractConnection, queue: str) -> bool:
    """True only if the broker says ``queue`` does not exist (not that its node is down);
    False when it exists or the question fails. On a channel of its own: a 404 closes it."""
    try:
        channel = await asyncio.wait_for(connection.channel(publisher_confirms=False), _ASK_WITHIN_S)
    except Exception:  # noqa: BLE001 - the connection is failing: its close says why
        return False
    try:
        await asyncio.wait_for(channel.declare_queue(queue, passive=True), _ASK_WITHIN_S)
    except aiormq.exceptions.ChannelNotFoundEntity as e:
        text = str(e)
        if "home node" in text or "down or inaccessible" in text:
            return False
        # A WARNING: the manager publishes those starts again, nobody has to act.
        logger.warning(
            "the start queue %s was deleted, and with it every start this service held from it: "
            "the service says which, for the manager to publish them again",
            queue,
        )
        return True
    except Exception:  # noqa: BLE001 - unanswered or refused otherwise: not evidence of a deletion
        return False
    with contextlib.suppress(Exception):
        await channel.close()
    return False
