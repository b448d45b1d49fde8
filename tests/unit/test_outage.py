"""``shared.outage.OutageLog``: an outage told when it begins, once a minute, and when it
ends, in the words of the dependency that is away (the database's, the broker's)."""

from __future__ import annotations

import logging

import pytest

from manager.db.errors import database_outage, describe
from shared.outage import OutageLog


def test_a_database_outage_is_told_when_it_begins_each_minute_and_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("unit.outage")
    outage = database_outage("applying state reports", log)
    with caplog.at_level(logging.DEBUG, logger="unit.outage"):
        outage.worked()  # nothing failed: nothing to say
        for _ in range(5):  # a retry a second
            outage.failed(describe(ConnectionRefusedError(111, "Connection refused")))
        outage.worked()
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said[0] == (
        "WARNING",
        "applying state reports: the database is unavailable or busy "
        "(ConnectionRefusedError: [Errno 111] Connection refused); retrying",
    )
    assert [level for level, _ in said] == ["WARNING", "DEBUG", "DEBUG", "DEBUG", "DEBUG", "INFO"]
    assert said[-1][1].startswith("applying state reports: the database answers again after 0s and 5 failed")

    caplog.clear()
    reminded = OutageLog(log, "the broker is unreachable", "connected to the broker", every_s=0)  # a minute has passed
    with caplog.at_level(logging.DEBUG, logger="unit.outage"):
        reminded.failed("lost the connection: ConnectionClosed")
        reminded.failed("the last attempt: refused")
        assert reminded.ongoing and reminded.failures == 2
        reminded.worked(", at rabbit@a")
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said[1] == (
        "WARNING",
        "the broker is unreachable (the last attempt: refused): 2 failed attempt(s) in 0s; retrying",
    )
    assert said[2] == ("INFO", "connected to the broker after 0s and 2 failed attempt(s), at rabbit@a")
    assert not reminded.ongoing and reminded.failures == 0
