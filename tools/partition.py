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

_CHUNK = 64 * 1024


class Partition:
    """Relays ``127.0.0.1:port`` to ``target_host:target_port`` until cut."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._loop = asyncio.new_event_loop()
        self._open = asyncio.Event()
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
        self._open.set()
        for writer in self._writers:
            writer.close()
        relays = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if relays:
            await asyncio.wait(relays, timeout=5)

    def cut(self) -> None:
        self._loop.call_soon_threadsafe(self._open.clear)

    def heal(self) -> None:
        self._loop.call_soon_threadsafe(self._open.set)

    def url_for(self, amqp_url: str) -> str:
        """``amqp_url`` with its host and port replaced by the relay's."""
        scheme, rest = amqp_url.split("://", 1)
        credentials, _, location = rest.rpartition("@")
        _, _, path = location.partition("/")
        prefix = f"{credentials}@" if credentials else ""
        return f"{scheme}://{prefix}127.0.0.1:{self.port}/{path}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._open.set()
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
        await self._open.wait()  # connected while cut: the handshake goes nowhere until healed
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        self._writers.add(upstream_writer)
        for writer in (client_writer, upstream_writer):
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(
            self._pump(client_reader, upstream_writer),
            self._pump(upstream_reader, client_writer),
        )

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._open.wait()
                data = await reader.read(_CHUNK)
                if not data:
                    break
                await self._open.wait()  # read just before a cut: held until the heal
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
