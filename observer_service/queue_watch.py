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
``WATCH_EVERY_S``. Asking whether the queue exists is not enough: another service that saw
the deletion declares the queue again within milliseconds, before the next question (CI saw
it: the cordoned service's twenty starts were gone and it never said so). So the watch binds
the queue to an auto-delete exchange of its own (a marker): deleting the queue removes the
binding, and with its last binding the broker deletes the exchange. A marker gone is a
deletion, whether or not the queue exists again. A queue is marked within ``MARK_WITHIN_S``
of the cordon; a deletion in that moment is still missed if the queue is declared again
before the mark. The marker is deleted when the watch ends;
a process killed meanwhile leaves it bound to the queue (an empty fanout exchange, nothing
routed through it) until the queue goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection

logger = logging.getLogger(__name__)

WATCH_EVERY_S = 3.0
# A cordoned service marks its queues this soon: a deletion before the marker is missed if the
# queue is declared again meanwhile.
MARK_WITHIN_S = 0.25
# Asked within ``asyncio.timeout``, never ``wait_for``: 3.11's ``wait_for`` runs the question as
# a task of its own, and when the session's close cancels it as the broker refuses the question,
# aiormq turns the cancel into the refusal, which nobody retrieves: an ERROR with a traceback.
_ASK_WITHIN_S = 5.0


async def while_cordoned(
    connection: AbstractConnection,
    watch_id: str,
    closing: Callable[[], bool],
    consuming: Callable[[], bool],
    queues: Callable[[], list[tuple[str, str]]],
    gone: Callable[[str, str], None],
) -> None:
    """Watch a holding connection's start queues (``queues``: pool, queue) while it consumes
    none of them: each is marked within ``MARK_WITHIN_S`` of the cordon and its marker asked
    about every ``WATCH_EVERY_S``; consuming again, the markers go. The first deletion seen
    is told (``gone``) and ends the watch; so does the task's cancel, unmarking."""
    marked: set[str] = set()
    unmarkable: set[str] = set()  # the broker refused the marker: the queue is asked about
    asked_at = 0.0
    try:
        while True:
            await asyncio.sleep(MARK_WITHIN_S)
            if closing():
                continue
            if consuming():
                for queue in list(marked):
                    await unmark(connection, watch_id, queue)
                    marked.discard(queue)
                unmarkable.clear()
                continue
            ask = time.monotonic() - asked_at >= WATCH_EVERY_S
            for pool, queue in queues():
                if await _gone(connection, watch_id, queue, marked, unmarkable, ask):
                    marked.discard(queue)
                    gone(pool, queue)
                    return
            if ask:
                asked_at = time.monotonic()
    finally:
        if not connection.is_closed:
            for queue in marked:
                await unmark(connection, watch_id, queue)


async def _gone(
    connection: AbstractConnection, watch_id: str, queue: str, marked: set[str], unmarkable: set[str], ask: bool
) -> bool:
    """Whether a start queue not consumed was deleted: by its marker, or by the queue itself
    where the broker refused a marker; an unmarked queue is marked now."""
    if queue in marked:
        return ask and await marker_gone(connection, watch_id, queue)
    if queue in unmarkable:
        return ask and await deleted(connection, queue)  # as before markers
    # Deleted before it was marked: the queue itself is missing (unless declared again
    # meanwhile); then the marker watches from here on.
    if await deleted(connection, queue):
        return True
    (marked if await mark(connection, watch_id, queue) else unmarkable).add(queue)
    return False


async def deleted(connection: AbstractConnection, queue: str) -> bool:
    """True only if the broker says ``queue`` does not exist (not that its node is down);
    False when it exists or the question fails."""
    missing = await _not_found(connection, lambda channel: channel.declare_queue(queue, passive=True))
    if missing is None or "home node" in missing or "down or inaccessible" in missing:
        return False
    _say_deleted(queue)
    return True


def marker_name(watch_id: str, queue: str) -> str:
    """The marker exchange of one watch of ``queue`` (``watch_id``: the holding connection's)."""
    return f"orch.watch.{watch_id}.{queue}"


async def mark(connection: AbstractConnection, watch_id: str, queue: str) -> bool:
    """Bind ``queue`` to a new marker exchange; False if that failed (the queue is asked about
    instead, as before the marker)."""
    try:
        async with asyncio.timeout(_ASK_WITHIN_S):
            channel = await connection.channel(publisher_confirms=False)
            name = marker_name(watch_id, queue)
            exchange = await channel.declare_exchange(name, "fanout", durable=False, auto_delete=True)
            declared = await channel.get_queue(queue, ensure=True)
            await declared.bind(exchange)
    except Exception:  # noqa: BLE001 - the connection is failing, or the queue is gone: asked about anyway
        return False
    with contextlib.suppress(Exception):
        await channel.close()
    return True


async def marker_gone(connection: AbstractConnection, watch_id: str, queue: str) -> bool:
    """True only if the broker says the marker of ``queue`` does not exist: the queue was
    deleted since it was marked (maybe declared again since)."""
    name = marker_name(watch_id, queue)
    if await _not_found(connection, lambda channel: channel.get_exchange(name, ensure=True)) is None:
        return False
    _say_deleted(queue)
    return True


async def unmark(connection: AbstractConnection, watch_id: str, queue: str) -> None:
    """Delete the marker of ``queue`` (the watch ended); nothing if it is gone already."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(_ASK_WITHIN_S):
            channel = await connection.channel(publisher_confirms=False)
            await channel.exchange_delete(marker_name(watch_id, queue))
            await channel.close()


async def _not_found(connection: AbstractConnection, ask: Callable[[AbstractChannel], Awaitable[object]]) -> str | None:
    """The broker's NOT_FOUND text for ``ask`` (a passive declare), on a channel of its own (a
    404 closes it); None when it was found or the question failed: no evidence of a deletion."""
    try:
        async with asyncio.timeout(_ASK_WITHIN_S):
            channel = await connection.channel(publisher_confirms=False)
    except Exception:  # noqa: BLE001 - the connection is failing: its close says why
        return None
    try:
        async with asyncio.timeout(_ASK_WITHIN_S):
            await ask(channel)
    except aiormq.exceptions.ChannelNotFoundEntity as e:
        return str(e)
    except Exception:  # noqa: BLE001 - unanswered or refused otherwise
        return None
    with contextlib.suppress(Exception):
        await channel.close()
    return None


def _say_deleted(queue: str) -> None:
    # A WARNING: the manager publishes those starts again, nobody has to act.
    logger.warning(
        "the start queue %s was deleted, and with it every start this service held from it: "
        "the service says which, for the manager to publish them again",
        queue,
    )
