"""``shared.amqp_frames.BufferedFrameReceiver`` on byte streams cut every way: it must yield
what aiormq's own receiver yields (pamqp's frames, in order) and fail as it fails."""

from __future__ import annotations

import asyncio
import random

import pytest
from aiormq.connection import ReceivedFrame
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError, ProtocolSyntaxError
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.frame import FrameTypes as Frame
from pamqp.frame import marshal
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from shared.amqp_frames import BufferedFrameReceiver


def _frames() -> list[tuple[int, Frame]]:
    """(channel, frame): deliveries as the broker sends them, a body of several frames, a
    heartbeat and method frames on channel 0."""
    out: list[tuple[int, Frame]] = [(0, spec.Connection.Tune(channel_max=2047, frame_max=131072, heartbeat=5))]
    for i in range(30):
        body = f"start {i}".encode() * (i % 4)
        properties = spec.Basic.Properties(content_type="application/json", delivery_mode=2, message_id=f"m{i}")
        out.append((1 + i % 3, spec.Basic.Deliver(f"ctag{i % 3}", i + 1, bool(i % 2), "", "orch.starts")))
        out.append((1 + i % 3, ContentHeader(0, len(body), properties)))
        if body:
            out.append((1 + i % 3, ContentBody(body)))
        if i == 10:
            out.append((0, Heartbeat()))
    big = bytes(range(256)) * 1024
    out.append((2, ContentBody(big[: 131072 - 8])))  # as large as a frame may be
    out.append((2, ContentBody(big[:100000])))
    out.append((0, spec.Connection.Close(320, "CONNECTION_FORCED", 0, 0)))
    return out


def _stream(frames: list[tuple[int, Frame]]) -> bytes:
    return b"".join(marshal(frame, channel) for channel, frame in frames)


async def _receive(data: bytes, cuts: list[int], count: int, *, eof: bool = True) -> list[ReceivedFrame]:
    """Feed ``data`` in pieces ending at ``cuts`` (a yield between each), then read ``count``."""
    reader = asyncio.StreamReader()
    receiver = BufferedFrameReceiver(reader)

    async def feed() -> None:
        start = 0
        for end in [*cuts, len(data)]:
            reader.feed_data(data[start:end])
            start = end
            await asyncio.sleep(0)
        if eof:
            reader.feed_eof()

    feeding = asyncio.create_task(feed())
    got = [await receiver.get_frame() for _ in range(count)]
    await feeding
    return got


@pytest.mark.parametrize("seed", range(6))
async def test_frames_cut_anywhere_come_out_whole_and_in_order(seed: int) -> None:
    frames = _frames()
    data = _stream(frames)
    rng = random.Random(seed)
    # Cut at random places; seed 0 cuts after every byte of the first 2,000.
    cuts = list(range(1, 2000)) if seed == 0 else sorted(rng.sample(range(1, len(data)), 40 * seed))
    got = await _receive(data, cuts, len(frames))

    assert [(channel, marshal(frame, channel)) for _, channel, frame in got] == [
        (channel, marshal(frame, channel)) for channel, frame in frames
    ]
    assert [size for size, _, _ in got] == [len(marshal(f, c)) for c, f in frames]


async def test_a_close_while_waiting_for_a_frame_is_a_connection_error() -> None:
    """The way a connection usually ends: the reader waits, and the socket closes. aiormq's
    reader then says the connection was lost with an ``AMQPConnectionError``, which the
    manager's log names as the cause."""
    reader = asyncio.StreamReader()
    receiver = BufferedFrameReceiver(reader)
    waiting = asyncio.create_task(receiver.get_frame())
    await asyncio.sleep(0.01)
    reader.feed_eof()
    with pytest.raises(AMQPConnectionError, match="unexpectedly closed with 0 bytes"):
        await waiting


async def test_a_close_seen_before_the_next_frame_is_asked_for_ends_the_iteration() -> None:
    data = _stream([(0, Heartbeat())])
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    receiver = BufferedFrameReceiver(reader)
    got = [(size, channel, type(frame)) async for size, channel, frame in receiver]
    assert got == [(8, 0, Heartbeat)]


async def test_a_close_within_a_frame_is_a_connection_error() -> None:
    data = _stream(_frames())
    first = len(marshal(spec.Connection.Tune(channel_max=2047, frame_max=131072, heartbeat=5), 0))
    with pytest.raises(AMQPConnectionError, match="unexpectedly closed with 5 bytes"):
        await _receive(data[: first + 5], [], 2)


async def test_a_frame_without_its_end_octet_is_refused() -> None:
    data = bytearray(_stream([(1, ContentBody(b"body"))]))
    data[-1] = 0
    with pytest.raises(InvalidFrameError):
        await _receive(bytes(data), [], 1)


async def test_the_brokers_protocol_header_is_a_protocol_error() -> None:
    # What a broker answers to a protocol version it does not speak, instead of Connection.Start.
    with pytest.raises(ProtocolSyntaxError):
        await _receive(b"AMQP\x00\x00\x09\x01", [], 1)


async def test_reads_wait_for_the_rest_of_a_frame() -> None:
    data = _stream([(0, Heartbeat()), (1, ContentBody(b"x" * 5000))])
    reader = asyncio.StreamReader()
    receiver = BufferedFrameReceiver(reader)
    reader.feed_data(data[:100])
    size, channel, frame = await receiver.get_frame()
    assert (size, channel, type(frame)) == (8, 0, Heartbeat)
    second = asyncio.create_task(receiver.get_frame())
    await asyncio.sleep(0.01)
    assert not second.done()
    reader.feed_data(data[100:])
    _, channel, body = await second
    assert channel == 1 and isinstance(body, ContentBody) and body.value == b"x" * 5000
