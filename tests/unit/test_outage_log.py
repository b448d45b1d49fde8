"""``manager.db.errors.OutageLog``: an outage told when it begins, once a minute, and when it
ends."""

from __future__ import annotations

import logging

import pytest

from manager.db.errors import OutageLog


def test_a_database_outage_is_told_when_it_begins_each_minute_and_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("unit.outage")
    outage = OutageLog("applying state reports", log, every_s=3600)
    with caplog.at_level(logging.DEBUG, logger="unit.outage"):
        outage.worked()  # nothing failed: nothing to say
        for _ in range(5):  # a retry a second
            outage.failed(ConnectionRefusedError(111, "Connection refused"))
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
    reminded = OutageLog("background repairs", log, every_s=0)  # a minute has always passed
    with caplog.at_level(logging.DEBUG, logger="unit.outage"):
        reminded.failed(OSError("down"))
        reminded.failed(OSError("down"))
    assert "still unavailable or busy after 0s and 2 attempts (OSError: down)" in caplog.records[-1].getMessage()
