"""``shared.logs``: the AMQP libraries' connection chatter only at debug."""

from __future__ import annotations

import logging

import pytest
from pamqp import commands

from shared.logs import configure_logging, last_chatter


def test_library_connection_chatter_is_shown_only_at_debug(capsys: pytest.CaptureFixture[str]) -> None:
    # aiormq and aio-pika log a lost connection, and every failed attempt to reopen it, as
    # ERRORs; the product says it once in its own words. Anything else they log stays.
    transport = logging.getLogger("aiormq.connection")
    tools = logging.getLogger("aio_pika.tools")

    def chatter() -> None:
        # the end of a close handshake aiormq had let go (after a partition heals): chatter
        transport.error("Got frame for closed channel %d: %r", 2, commands.Channel.CloseOk())
        transport.error("Got frame for closed channel %d: %r", 3, commands.Basic.Ack(7))  # not chatter
        transport.error("error when creating transport: %r", ConnectionRefusedError(111, "Connection refused"))
        transport.error("Unexpected connection close from remote %r", "CONNECTION_FORCED")
        tools.error(
            "Callback %r error: %s: %s",
            "<OneShotCallback: cb=<bound method RobustChannel._on_close of <RobustChannel>>>",
            "ChannelInvalidStateError",
            "No active transport in channel",
        )
        tools.error(  # the channel closed just before its connection (a vhost deleted)
            "Callback %r error: %s: %s",
            "<OneShotCallback: cb=<bound method RobustChannel._on_close of <RobustChannel>>>",
            "RuntimeError",
            RuntimeError('<Connection: "amqp://orch:******@127.0.0.1:5682/v" at 0x7f> closed'),
        )
        tools.error(  # any other failure to reopen is shown, as a WARNING
            "Callback %r error: %s: %s",
            "<OneShotCallback: cb=<bound method RobustChannel._on_close of <RobustChannel>>>",
            "ChannelAccessRefused",
            "ACCESS_REFUSED - access to exchange 'orch.dead' in vhost 'v' refused for user 'orch'",
        )
        transport.error("Unexpected frame %r", "a frame")  # not chatter
        tools.error("Callback %r error: %s: %s", "<OneShotCallback: cb=ours>", "KeyError", "x")  # ours failed

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("INFO", "unit")
        chatter()
        shown = capsys.readouterr().err
        assert "creating transport" not in shown and "Unexpected connection close" not in shown, shown
        assert shown.count("RobustChannel._on_close") == 1, shown
        assert "WARNING [unit] aio_pika.tools: Callback" in shown and "ACCESS_REFUSED" in shown, shown
        assert "ERROR [unit] aiormq.connection: Unexpected frame 'a frame'" in shown, shown
        assert "closed channel 2" not in shown, shown
        assert "ERROR [unit] aiormq.connection: Got frame for closed channel 3" in shown, shown
        assert "ERROR [unit] aio_pika.tools: Callback '<OneShotCallback: cb=ours>' error: KeyError" in shown, shown
        # what was kept from the log can still be quoted (the manager's reminder that the broker is still away)
        assert last_chatter("aiormq.connection") == "Unexpected connection close from remote 'CONNECTION_FORCED'"

        configure_logging("DEBUG", "unit")  # configured again: still one filter per logger
        chatter()
        shown = capsys.readouterr().err
        assert shown.count("DEBUG [unit] aiormq.connection: error when creating transport") == 1, shown
        assert shown.count("DEBUG [unit] aiormq.connection: Got frame for closed channel 2") == 1, shown
        assert shown.count("DEBUG [unit] aio_pika.tools: Callback") == 2, shown
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
