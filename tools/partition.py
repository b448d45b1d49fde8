"""A network partition between one process and the broker, for tests: a TCP relay on
loopback that can stop carrying bytes without closing anything.

Killing a process, freezing it (SIGSTOP) or closing its connection from the broker each tell
one side at once, or stop both. A partition tells neither: the process runs on, its sockets
stay open, and nothing arrives until a heartbeat timer on either side gives up. That is the
case the fencing lease exists for (``observer_service/lease.py``), and the one a real
network (a switch, a firewall dropping packets) produces.

``cut()`` makes the relay stop reading in both directions: what was sent waits in the
kernel's buffers, and once they fill the sender's writes block, as TCP behaves while its
segments are being dropped and retransmitted. ``heal()`` carries on from where it stopped,
in order, like TCP's retransmission after the network returns. A peer that gave up and
closed its socket meanwhile is seen when the relay reads again, and the close is passed on.
``cut("to_server")`` and ``cut("to_client")`` stop one direction only (a firewall rule or a
route lost one way): the other still carries everything, a close included.
Connections made while cut are accepted and carry nothing until healed (a real partition
would leave the SYN unanswered; either way the handshake does not complete in time).

The relay runs its own event loop in a daemon thread, so a synchronous test can use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from types import TracebackType
from typing import Literal

_CHUNK = 64 * 1024

Direction = Literal["both", "to_server", "to_client"]


class Partition:
    """Relays ``127.0.0.1:port`` to ``target_host:target_port`` until cut."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._loop = asyncio.new_event_loop()
        # Whether bytes flow from the client to the server, and from the server to the client.
        self._to_server = asyncio.Event()
        self._to_client = asyncio.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="partition-relay", daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.connections = 0  # accepted so far

    @classmethod
    def before(cls, url: str) -> Partition:
        """A relay to the server a URL names (``scheme://user:pass@host:port/path``)."""
        host, _, port = url.rpartition("@")[2].split("/")[0].rpartition(":")
        return cls(host, int(port))

    def __enter__(self) -> Partition:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the partition relay did not start")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _shut(self) -> None:
        """Close the listener and every relayed connection, and let the relays end: healed
        first, so none waits on the cut; not cancelled (asyncio's server callback logs a
        traceback for a connection handler that ends cancelled)."""
        assert self._server is not None
        self._server.close()
        self._to_server.set()
        self._to_client.set()
        for writer in self._writers:
            writer.close()
        relays = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if relays:
            await asyncio.wait(relays, timeout=5)

    def cut(self, direction: Direction = "both") -> None:
        if direction in ("both", "to_server"):
            self._loop.call_soon_threadsafe(self._to_server.clear)
        if direction in ("both", "to_client"):
            self._loop.call_soon_threadsafe(self._to_client.clear)

    def heal(self) -> None:
        self._loop.call_soon_threadsafe(self._to_server.set)
        self._loop.call_soon_threadsafe(self._to_client.set)

    def url_for(self, amqp_url: str) -> str:
        """``amqp_url`` with its host and port replaced by the relay's."""
        scheme, rest = amqp_url.split("://", 1)
        credentials, _, location = rest.rpartition("@")
        _, _, path = location.partition("/")
        prefix = f"{credentials}@" if credentials else ""
        return f"{scheme}://{prefix}127.0.0.1:{self.port}/{path}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._to_server.set()
        self._to_client.set()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._relay, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(client_writer)
        # Connected while cut (either way): the handshake goes nowhere until healed.
        await self._to_server.wait()
        await self._to_client.wait()
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        self._writers.add(upstream_writer)
        for writer in (client_writer, upstream_writer):
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(
            self._pump(client_reader, upstream_writer, self._to_server),
            self._pump(upstream_reader, client_writer, self._to_client),
        )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, flowing: asyncio.Event) -> None:
        try:
            while True:
                await flowing.wait()
                data = await reader.read(_CHUNK)
                if not data:
                    break
                await flowing.wait()  # read just before a cut: held until the heal
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
