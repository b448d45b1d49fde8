"""Whether a start queue this session holds starts from was deleted (issue 62, items 6 and 10).

Deleting a queue drops its messages, the ones consumers hold unacked too: the starts of every
observer this session runs from it are gone, and nothing would ever publish them again but
the manager's slow lost-start repair (131 s seen). So the service tells the manager which
starts died with the queue (``StartsGone``), and the manager publishes them again at once.

That must be said only when the queue was truly deleted: a start published again while the
first copy still exists would run twice. Asking whether the queue exists is not enough:
* another service that saw the deletion declares the queue again within milliseconds;
* the broker's ``basic.cancel`` carries no reason (a deleted queue, a quorum queue's consumer
  timeout, a classic queue whose node went down), and a quorum queue is cancelled before its
  record goes: ``rabbit_quorum_queue:delete/4`` deletes the Raft cluster, waits up to its
  ``DELETE_TIMEOUT`` (5 s) for the leader to stop, and only then deletes the record (and, before
  4.3, the bindings). A passive declare right after the cancel finds the queue.
So each session binds every start queue it holds to an auto-delete exchange of its own (a
marker, ``orch.watch.<session>.<queue>``): deleting the queue removes the binding, and with its
last binding the broker deletes the exchange. A marker gone is a deletion, whether or not the
queue exists again. After a cancel the marker is watched for ``VERDICT_WITHIN_S``; a queue not
marked yet is asked about once ("no queue" is a deletion; a 404 that says the queue's home node
is down is not: its messages come back with the node).

A service that consumes nothing (cordoned: a drain) gets no ``basic.cancel`` at all, and its
held deliveries vanish silently (a later nack or ack of them does nothing). So while it does
not consume, its markers are asked about every ``WATCH_EVERY_S``.

A session's markers go when it closes with its connection alive; those of a connection lost
at the service's next session (``HoldingConnection.markers_left``), those of a process killed
when the manager forgets the service (``ForgetServices``, ``manager/repairs/housekeeping.py``):
meanwhile each is an empty fanout exchange, nothing routed through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection

from shared.topology import marker_name

logger = logging.getLogger(__name__)

WATCH_EVERY_S = 3.0
# RabbitMQ's DELETE_TIMEOUT for a quorum queue's Raft cluster (5 s in 3.10 to 4.3), and a margin.
VERDICT_WITHIN_S = 6.0
_VERDICT_EVERY_S = 0.1
# Asked within ``asyncio.timeout``, never ``wait_for``: 3.11's ``wait_for`` runs the question as
# a task of its own, and when the session's close cancels it as the broker refuses the question,
# aiormq turns the cancel into the refusal, which nobody retrieves: an ERROR with a traceback.
_ASK_WITHIN_S = 5.0


class Markers:
    """The markers of one session's start queues, on its holding connection (its loop only),
    and the verdicts on its cancelled consumers."""

    def __init__(self, connection: AbstractConnection, session: str, left: list[tuple[str, str]]) -> None:
        self._connection = connection
        self.session = session
        self.marked: set[str] = set()
        self.left = list(left)  # (session, queue): earlier sessions' markers not deleted yet
        self.gone_pools: set[str] = set()  # pools whose start queue was deleted, as judged
        self._verdicts: list[asyncio.Task[None]] = []

    def cancelled(self, pool: str, queue: str) -> None:
        """The broker cancelled a consumer of ``queue``: judge, beside, whether it was deleted."""
        self._verdicts.append(asyncio.create_task(self._judge(pool, queue), name=f"verdict on {queue}"))

    async def _judge(self, pool: str, queue: str) -> None:
        if await self.verdict(queue):
            self.gone_pools.add(pool)

    async def deleted_pools(self) -> set[str]:
        """``gone_pools`` once every cancelled consumer's queue has been judged."""
        for task in self._verdicts:
            with contextlib.suppress(Exception):
                await task
        return set(self.gone_pools)

    async def mark(self, queue: str) -> None:
        """Bind ``queue`` to a new marker; a failure leaves it unmarked (asked about instead)."""
        if queue in self.marked:
            return
        try:
            async with asyncio.timeout(_ASK_WITHIN_S):
                channel = await self._connection.channel(publisher_confirms=False)
                name = marker_name(self.session, queue)
                exchange = await channel.declare_exchange(name, "fanout", durable=False, auto_delete=True)
                declared = await channel.get_queue(queue, ensure=True)
                await declared.bind(exchange)
        except Exception:  # noqa: BLE001 - the connection is failing, or the queue is gone
            return
        self.marked.add(queue)
        with contextlib.suppress(Exception):
            await channel.close()

    async def unmark(self, queue: str) -> None:
        """Delete ``queue``'s marker: this session no longer consumes it (it is past the start
        queues the manager keeps, and will be deleted). Left for the next session on failure."""
        if queue not in self.marked:
            return
        self.marked.discard(queue)
        if not await _delete_markers(self._connection, [marker_name(self.session, queue)]):
            self.left.append((self.session, queue))

    async def gone(self, queue: str) -> bool:
        """Whether ``queue`` was deleted: by its marker, or, unmarked, by the queue itself
        (then marked, unless deleted)."""
        if queue in self.marked:
            return await self._marker_gone(queue)
        if await deleted(self._connection, queue):
            return True
        await self.mark(queue)
        return False

    async def verdict(self, queue: str) -> bool:
        """After a ``basic.cancel`` on ``queue``: whether it was deleted, watching its marker
        for up to ``VERDICT_WITHIN_S`` while the broker finishes the deletion."""
        if queue not in self.marked:
            return await deleted(self._connection, queue)
        until = time.monotonic() + VERDICT_WITHIN_S
        while not await self._marker_gone(queue):
            if time.monotonic() >= until:
                logger.info("%s was not deleted: its consumer was cancelled for another reason", queue)
                return False
            await asyncio.sleep(_VERDICT_EVERY_S)
        return True

    async def _marker_gone(self, queue: str) -> bool:
        name = marker_name(self.session, queue)
        if await _not_found(self._connection, lambda channel: channel.get_exchange(name, ensure=True)) is None:
            return False
        self.marked.discard(queue)
        _say_deleted(queue)
        return True

    async def forget_left(self) -> None:
        """Delete the markers earlier sessions left (at this session's open)."""
        if await _delete_markers(self._connection, [marker_name(s, q) for s, q in self.left]):
            self.left = []

    async def close(self) -> list[tuple[str, str]]:
        """End the verdicts and delete every marker while the connection lives; returns the
        markers left (session, queue), for the service's next session to delete."""
        for task in self._verdicts:
            task.cancel()
        for task in self._verdicts:
            with contextlib.suppress(BaseException):
                await task
        left = self.left + [(self.session, queue) for queue in self.marked]
        names = [marker_name(s, q) for s, q in left]
        if not self._connection.is_closed and await _delete_markers(self._connection, names):
            left = []
        self.marked.clear()
        self.left = left
        return left


async def _delete_markers(connection: AbstractConnection, names: list[str]) -> bool:
    """Delete the named markers (one already gone is no error: ``exchange.delete`` of a
    missing exchange is answered ok); False if that failed."""
    if not names:
        return True
    try:
        async with asyncio.timeout(_ASK_WITHIN_S + len(names) / 100):
            channel = await connection.channel(publisher_confirms=False)
            for name in names:
                await channel.exchange_delete(name)
            await channel.close()
    except Exception:  # noqa: BLE001 - the connection is failing: left for later
        return False
    return True


async def while_cordoned(
    markers: Markers,
    closing: Callable[[], bool],
    consuming: Callable[[], bool],
    queues: Callable[[], list[tuple[str, str]]],
    gone: Callable[[str, str], None],
) -> None:
    """Watch a holding connection's start queues (``queues``: pool, queue) while it consumes
    none of them: each is asked about every ``WATCH_EVERY_S``. The first deletion seen is
    told (``gone``) and ends the watch."""
    while True:
        await asyncio.sleep(WATCH_EVERY_S)
        if closing() or consuming():
            continue
        for pool, queue in queues():
            if await markers.gone(queue):
                gone(pool, queue)
                return


async def deleted(connection: AbstractConnection, queue: str) -> bool:
    """True only if the broker says ``queue`` does not exist (not that its node is down);
    False when it exists or the question fails."""
    missing = await _not_found(connection, lambda channel: channel.declare_queue(queue, passive=True))
    if missing is None or "home node" in missing or "down or inaccessible" in missing:
        return False
    _say_deleted(queue)
    return True


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
