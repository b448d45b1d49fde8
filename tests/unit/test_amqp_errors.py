"""``shared.amqp_errors``: connect failures and closes described for an operator."""

from __future__ import annotations

import asyncio

import aiormq

from shared.amqp_errors import describe_close, describe_connect_failure


def test_a_refused_virtual_host_is_told_by_name_and_other_connect_failures_as_they_are() -> None:
    refused = aiormq.exceptions.InvalidFrameError(
        "Expected one of ['Connection.OpenOk'], got <Connection.Close object at 0x7f3>"
    )
    said = describe_connect_failure(refused, "amqp://orch:secret@127.0.0.1:5672/%2F")
    assert said.startswith("the broker refused the virtual host '/' to user 'orch'") and "secret" not in said
    assert "'orch-prod'" in describe_connect_failure(refused, "amqp://orch:secret@127.0.0.1:5672/orch-prod")
    other = ConnectionRefusedError(111, "Connection refused")
    assert describe_connect_failure(other, "amqp://orch:secret@127.0.0.1:5672/") == repr(other)


def test_a_connection_that_stopped_answering_is_told_as_such() -> None:
    # aiormq cancels its reader when no frame came for (heartbeat + 1) x 3 seconds
    said = describe_close(asyncio.CancelledError(), 6)
    assert said.startswith("no frame from the broker for 21s") and "stopped answering" in said
    forced = aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED - broker forced connection closure")
    assert describe_close(forced, 6) == f"closed by broker or network: {forced!r}"
