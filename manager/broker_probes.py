"""Questions the manager asks the broker on connections of their own, apart from its
publishing and consuming connection (``manager/broker.py``): whether services' connections
live (liveness), a touch of each start queue (the queue waker), which start queues exist, and
the rebuild marker; and the deletion of queue markers services gone left.

Each of them may close the channel it runs on (a passive declare of a queue that does not
exist, or that another connection holds exclusively), and a slow answer to one must hold up
no publish. Every failure is ``BrokerUnavailable``, caused by the broker's error: no answer
is no evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel
from pamqp.common import FieldTable

from manager.settings import MAX_START_QUEUES, ManagerSettings
from shared import topology
from shared.amqp_errors import cancelled_calls_as_errors
from shared.broker_nodes import BrokerNodes, node_name
from shared.errors import BrokerUnavailable
from shared.settings import amqp_url_with_heartbeat

logger = logging.getLogger(__name__)

_PRESENCE_CHECKS_AT_ONCE = 32
# How long a batch of presence checks, or one start queue's touch, may wait for its answer.
_ANSWER_TIMEOUT_S = 10.0


def _named(name: str) -> FieldTable:
    return {"connection_name": name}


class BrokerProbes:
    def __init__(self, settings: ManagerSettings, nodes: BrokerNodes) -> None:
        self.settings = settings
        self.nodes = nodes  # the node the manager's link uses
        self._presence: aiormq.abc.AbstractConnection | None = None
        self._waker: aiormq.abc.AbstractConnection | None = None
        self._waker_channel: aiormq.abc.AbstractChannel | None = None

    def _url(self) -> str:
        return amqp_url_with_heartbeat(self.nodes.current, self.settings.amqp_heartbeat_s)

    async def marker_present(self) -> bool:
        """Whether the rebuild marker queue exists (``_on_marker_channel`` says why not
        through the robust channel)."""
        try:
            await self._on_marker_channel(
                "check the rebuild marker", lambda ch: ch.declare_queue(topology.REBUILD_MARKER, passive=True)
            )
        except BrokerUnavailable as e:
            if isinstance(e.__cause__, aio_pika.exceptions.ChannelNotFoundEntity):
                return False
            raise
        return True

    async def declare_marker(self) -> None:
        await self._on_marker_channel(
            "declare the rebuild marker", lambda ch: topology.declare_marker(ch, self.settings.queue_type)
        )

    async def _on_marker_channel(self, what: str, act: Callable[[AbstractChannel], Awaitable[object]]) -> None:
        """``act`` on a channel of a connection of its own: a passive declare of a missing
        queue closes its channel, and the robust channel would re-declare after a reconnect
        whatever was declared through it (the marker must be declared only by a rebuild).
        Any failure is ``BrokerUnavailable``, caused by the broker's error."""
        try:
            with cancelled_calls_as_errors():
                connection = await aio_pika.connect(
                    self._url(), client_properties={"connection_name": f"manager: {what}"}
                )
                async with connection:
                    await act(await connection.channel())
        except Exception as e:
            raise BrokerUnavailable(f"cannot {what}: {e!r}") from e

    async def services_connected(
        self, service_ids: Iterable[uuid.UUID], sessions: dict[uuid.UUID, uuid.UUID | None] | None = None
    ) -> dict[uuid.UUID, bool]:
        """Whether each service's broker connection lives, asked of the broker itself, whose
        answer does not depend on how late the service's reports are. A service's control
        queue is ``exclusive``: it lives exactly as long as the connection that declared it,
        and a passive declare of it from another connection answers RESOURCE_LOCKED (405)
        while that connection lives and NOT_FOUND (404) once it is gone (docs/design.md,
        invariant 7, "Lateness is not death"). Each check closes its channel, so they run on a
        plain connection of their own. Raises ``BrokerUnavailable`` if the broker cannot
        be asked: no answer is no evidence."""
        ids = list(service_ids)
        if not ids:
            return {}
        try:
            with cancelled_calls_as_errors():
                if self._presence is None or self._presence.is_closed:
                    self._presence = await aiormq.connect(self._url(), client_properties=_named("manager: presence"))
                connection = self._presence
                limit = asyncio.Semaphore(_PRESENCE_CHECKS_AT_ONCE)

                async def held(queue: str) -> bool:
                    async with limit:
                        channel = await connection.channel()
                        try:
                            await channel.queue_declare(queue, passive=True)
                        except aiormq.exceptions.ChannelLockedResource:
                            return True
                        except aiormq.exceptions.ChannelNotFoundEntity:
                            return False
                        with contextlib.suppress(Exception):
                            await channel.close()
                        return True  # declared without a lock: only its owner could, so it lives

                async def connected(service_id: uuid.UUID) -> bool:
                    if await held(topology.control_queue_name(service_id)):
                        return True
                    # Its last session may have named its queue after itself (the usual one
                    # held by a node that was down: ``topology.control_queue_name``).
                    session_id = (sessions or {}).get(service_id)
                    return session_id is not None and await held(topology.control_queue_name(service_id, session_id))

                answers = await asyncio.wait_for(asyncio.gather(*map(connected, ids)), _ANSWER_TIMEOUT_S)
        except Exception as e:
            raise BrokerUnavailable(f"cannot ask the broker which services are connected: {e!r}") from e
        return dict(zip(ids, answers, strict=True))

    async def touch_start_queues(self, pools: Iterable[str]) -> None:
        """A passive declare of each pool's start queues: a call to the queue's process,
        which keeps it from hibernating (``manager/queue_waker.py``). A slow answer holds up
        no publish. Raises ``BrokerUnavailable`` if the broker cannot be reached."""
        async with self._waker_questions("reach the start queues"):
            for pool in pools:
                for queue in topology.start_queue_names(pool, self.settings.start_queues):
                    await self._exists(queue)

    async def declare_start_queue_on_node(self, pool: str, index: int) -> bool:
        """Declare ``pool``'s start queue ``index`` from node ``index`` of ``ORCH_AMQP_URLS``
        (round the list): a new quorum queue leads on the node it was declared from, unless a
        policy or the broker's ``queue_leader_locator`` says otherwise, so a pool's queues lead
        on different nodes. False if that node could not be reached (declare it elsewhere)."""
        urls = self.nodes.urls
        url = amqp_url_with_heartbeat(urls[index % len(urls)], self.settings.amqp_heartbeat_s)
        name = f"manager: declare {topology.start_queue_name(pool, index)}"
        try:
            with cancelled_calls_as_errors():
                connection = await asyncio.wait_for(
                    aio_pika.connect(url, client_properties={"connection_name": name}), _ANSWER_TIMEOUT_S
                )
                async with connection:
                    channel = await connection.channel()
                    await topology.declare_start_queue(channel, pool, self.settings.queue_type, index)
        except Exception as e:  # noqa: BLE001 - declared on the manager's own connection instead
            logger.info("cannot declare %s at %s (%r): declared on this manager's node", name, node_name(url), e)
            return False
        return True

    async def start_queues_in_use(self, pool: str, at_least: int) -> int:
        """How many start queues ``pool`` has: ``at_least``, or more where a larger
        ``ORCH_START_QUEUES`` declared them (they are numbered without gaps)."""
        count = at_least
        async with self._waker_questions(f"ask for the start queues of pool {pool}"):
            while count < MAX_START_QUEUES and await self._exists(topology.start_queue_name(pool, count)):
                count += 1
        return count

    async def start_queue_use(self, pool: str, index: int) -> tuple[int, int] | None:
        """Starts ready in a pool's start queue ``index``, and its consumers (on a quorum queue,
        also the cancelled ones that still hold deliveries); None if it does not exist."""
        name = topology.start_queue_name(pool, index)
        async with self._waker_questions(f"ask how {name} is used"):
            channel = await self._waker_ready()
            try:
                async with asyncio.timeout(_ANSWER_TIMEOUT_S):
                    ok = await channel.queue_declare(name, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                return None
            return ok.message_count or 0, ok.consumer_count or 0

    async def delete_start_queue(self, pool: str, index: int) -> bool:
        """Delete a pool's start queue ``index``, found empty and unused by the caller
        (``manager/balance/retire.py``); False if the broker refused. A classic queue is
        deleted only if the broker finds it so too (``if-unused``, ``if-empty``); a quorum
        queue refuses both flags ("not supported by quorum queues", ``rabbit_quorum_queue:delete/4``,
        3.10 to 4.3), so the caller's finding is all there is."""
        name = topology.start_queue_name(pool, index)
        guarded = self.settings.queue_type == "classic"
        async with self._waker_questions(f"delete {name}"):
            channel = await self._waker_ready()
            try:
                async with asyncio.timeout(_ANSWER_TIMEOUT_S):
                    await channel.queue_delete(name, if_unused=guarded, if_empty=guarded)
            except aiormq.exceptions.ChannelPreconditionFailed as e:
                logger.info("%s not deleted: %s", name, e)
                return False
        return True

    async def start_queue_exists(self, pool: str, index: int) -> bool:
        async with self._waker_questions(f"ask for start queue {index} of pool {pool}"):
            return await self._exists(topology.start_queue_name(pool, index))

    @contextlib.asynccontextmanager
    async def _waker_questions(self, what: str) -> AsyncIterator[None]:
        """Questions about start queues, on the waker's connection: a missing queue's answer
        closes its channel, opened again for the next question (``_exists``). Any failure is
        ``BrokerUnavailable``, and the channel is not used again: its answer may still come."""
        try:
            with cancelled_calls_as_errors():
                yield
        except Exception as e:
            if self._waker_channel is not None:
                with contextlib.suppress(Exception):
                    await self._waker_channel.close()
                self._waker_channel = None
            raise BrokerUnavailable(f"cannot {what}: {e!r}") from e

    async def delete_exchanges(self, names: Iterable[str]) -> None:
        """Delete the named exchanges (one that does not exist is no error: RabbitMQ answers
        ``exchange.delete`` of a missing exchange with delete-ok, 3.10 to 4.3)."""
        async with self._waker_questions("delete the queue markers of services gone"):
            channel = await self._waker_ready()
            for name in names:
                async with asyncio.timeout(_ANSWER_TIMEOUT_S):
                    await channel.exchange_delete(name)

    async def _waker_ready(self) -> aiormq.abc.AbstractChannel:
        if self._waker is None or self._waker.is_closed:
            self._waker = await aiormq.connect(self._url(), client_properties=_named("manager: queue waker"))
        if self._waker_channel is None or self._waker_channel.is_closed:
            self._waker_channel = await self._waker.channel()
        return self._waker_channel

    async def _exists(self, queue: str) -> bool:
        """A passive declare of ``queue`` (a call to its process): False if the broker says it
        does not exist."""
        channel = await self._waker_ready()
        try:
            async with asyncio.timeout(_ANSWER_TIMEOUT_S):
                await channel.queue_declare(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
        return True

    async def close(self) -> None:
        for connection in (self._presence, self._waker):
            if connection is not None:
                with contextlib.suppress(Exception):
                    await connection.close()
