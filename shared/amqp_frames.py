"""A buffered frame reader for aiormq's connections: the per-frame cost of a failover's flood.

aiormq reads each frame with three ``readexactly`` calls under an ``asyncio.Lock`` into a
fresh ``BytesIO``. A start delivery is three frames (method, header, body), and after a
node's death one service takes about 10,000 of them a second on its holding thread, which
shares the GIL with the loop that starts their observers (docs/design.md, "What the second
after T is made of"). ``BufferedFrameReceiver`` reads what the socket has, up to
``_READ_SIZE`` at a time, and cuts the frames from it; decoding stays pamqp's, and every
error is raised as aiormq's own reader raises it.

aiormq builds its receiver by the module-level name ``aiormq.connection.FrameReceiver`` when
a connection opens, so ``install`` rebinds that name: every connection the process opens
afterwards reads this way. ``pyproject.toml`` pins aiormq to the minor version this was read
from; ``tests/system/test_amqp_frames.py`` checks it against a real broker.
"""

from __future__ import annotations

import asyncio

import aiormq.connection
import pamqp.frame
from aiormq.connection import ReceivedFrame
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError, ProtocolSyntaxError
from pamqp.exceptions import PAMQPException

_HEADER_SIZE = 7  # frame type, channel, payload size; a frame-end octet follows the payload
_READ_SIZE = 1 << 17  # what one read may take: the broker's default frame_max is 128 KiB


class BufferedFrameReceiver(aiormq.connection.FrameReceiver):
    """aiormq's ``FrameReceiver`` (an async iterator of (size, channel, frame)), reading ahead."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        super().__init__(reader)
        self._data = b""
        self._at = 0  # where the next frame starts in ``_data``

    async def get_frame(self) -> ReceivedFrame:
        while True:
            frame = self._cut()
            if frame is not None:
                return frame
            if self._at == len(self._data) and self.reader.at_eof():
                raise StopAsyncIteration  # closed before this call, between frames: as aiormq's
            async with self.lock:  # one read at a time, as aiormq's own
                if self._complete() == 0:
                    await self._read()

    def _complete(self) -> int:
        """The end of the next frame in ``_data`` if all of it is there, else 0."""
        data, at = self._data, self._at
        if len(data) - at < _HEADER_SIZE:
            return 0
        if not self.started:
            if data.startswith(b"AMQP", at):  # the broker refused our protocol version
                raise ProtocolSyntaxError("Unexpected AMQP protocol header")
            self.started = True
        end = at + _HEADER_SIZE + int.from_bytes(data[at + 3 : at + 7], "big") + 1
        return end if end <= len(data) else 0

    def _cut(self) -> ReceivedFrame | None:
        end = self._complete()
        if not end:
            return None
        raw, self._at = self._data[self._at : end], end
        try:
            return pamqp.frame.unmarshal(raw)
        except PAMQPException as e:
            raise InvalidFrameError(str(e)) from e

    async def _read(self) -> None:
        try:
            chunk = await self.reader.read(_READ_SIZE)
        except ConnectionRefusedError as e:
            raise AMQPConnectionError(f"Server connection refused: {e!r}") from e
        except ConnectionResetError as e:
            raise AMQPConnectionError(f"Server connection reset: {e!r}") from e
        except ConnectionError as e:
            raise AMQPConnectionError(f"Server connection error: {e!r}") from e
        except OSError as e:
            raise AMQPConnectionError(f"Server communication error: {e!r}") from e
        left = len(self._data) - self._at
        if not chunk:  # closed while waiting for a frame: an error, as aiormq's own says
            raise AMQPConnectionError(f"Server connection unexpectedly closed with {left} bytes of a frame read")
        self._data = self._data[self._at :] + chunk if left else chunk
        self._at = 0


def install() -> None:
    """Make every aiormq connection this process opens from now on read with
    ``BufferedFrameReceiver``. Call it once, at the start of a process."""
    aiormq.connection.FrameReceiver = BufferedFrameReceiver  # type: ignore[misc]
