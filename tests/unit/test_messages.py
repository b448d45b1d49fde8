"""``shared.messages``: every message round-trips by type, garbage and another stream's bodies
are refused, a retry policy's delays."""

from __future__ import annotations

import uuid

import pytest

from shared.errors import DecodeError
from shared.messages import (
    ObserversStarted,
    RetryPolicy,
    ServiceHeartbeat,
    StartObserver,
    StopObservers,
    decode_control,
    decode_start,
    decode_state,
)


def test_messages_round_trip_by_type() -> None:
    started = ObserversStarted(observer_ids=[uuid.uuid4()], service_id=uuid.uuid4(), redelivered=True)
    assert decode_state(started.encode()) == started
    stop = StopObservers(observer_ids=[uuid.uuid4()])
    assert decode_control(stop.encode()) == stop
    start = StartObserver(observer_id=uuid.uuid4(), name="n", kind="ticker", args={"interval_s": 2})
    assert decode_start(start.encode()) == start


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[]",
        b'{"type": "Nope"}',
        b'{"type": "ServiceHeartbeat"}',
        b'{"type": "ObserversStarted", "x": 1}',
    ],
)
def test_garbage_state_bodies_raise_decode_error(body: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_state(body)


def test_a_message_of_another_stream_is_refused() -> None:
    heartbeat = ServiceHeartbeat(service_id=uuid.uuid4(), running=1)
    with pytest.raises(DecodeError):
        decode_control(heartbeat.encode())
    with pytest.raises(DecodeError):
        decode_start(heartbeat.encode())


def test_retry_delays_grow_by_the_factor_up_to_the_cap_with_bounded_jitter() -> None:
    policy = RetryPolicy(initial_delay_s=1, factor=2, max_delay_s=10, jitter=0.1, max_attempts=4)
    assert [policy.delay_s(n, 0) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 8, 10]
    assert policy.delay_s(1, 1) == pytest.approx(1.1) and policy.delay_s(1, -1) == pytest.approx(0.9)
    assert policy.delay_s(10_000, 0) == 10  # no overflow
    assert [policy.gives_up(n) for n in (3, 4)] == [False, True]
    assert not RetryPolicy(max_attempts=None).gives_up(10**9)
