"""``manager.repairs.loop``: the schedule of the repairs."""

from __future__ import annotations

from typing import cast

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from manager.broker import BrokerLink
from manager.repairs.loop import Schedule, state_side_repairs
from manager.settings import ManagerSettings
from manager.start_publisher import StartPublisher
from manager.state.probation import ProbationPolicy
from manager.state.rules import StateRules


def test_repairs_with_long_thresholds_run_at_a_quarter_of_them() -> None:
    # Given the default thresholds: re-stop after 10 s, lost starts after 60 s
    repairs = state_side_repairs(
        ManagerSettings(),
        cast(async_sessionmaker[AsyncSession], None),
        cast(BrokerLink, None),
        StateRules(ProbationPolicy(3, 600)),
        StartPublisher(cast(async_sessionmaker[AsyncSession], None), cast(BrokerLink, None)),
        lambda: True,
    )
    schedule = Schedule(repairs)
    assert schedule.periods["restop"] == 2.5 and schedule.periods["republish_lost"] == 15.0
    assert schedule.periods["judge_heartbeats"] == 3.75  # a quarter of 3 heartbeats of 5 s
    assert schedule.periods["fold_counts"] == 5.0  # readers add up what is not folded yet
    assert schedule.periods["republish_pending"] == 7.5  # a quarter of 30 s
    assert all(repair.name and callable(repair.run) for repair in repairs)  # each names a repair
    assert schedule.periods["balance"] == 1.0  # the balancer rounds at the repairs' own pace
    assert schedule.periods["forget_services"] == 60.0  # an hour's retention, checked a minute at most
    assert schedule.periods["republish_gone"] == 0.0  # every pass: a deleted queue's starts within a second
    assert len(schedule.periods) == len(repairs) == 13  # names are unique

    # A repair with a period runs, then not again until the period passed
    assert schedule.due("restop", 100.0)
    schedule.ran("restop", 100.0)
    assert not schedule.due("restop", 102.0) and schedule.due("restop", 102.5)
    # A repair without one runs every pass; one that failed (not marked ran) runs next pass
    schedule.ran("describe_unknown", 100.0)
    assert schedule.due("describe_unknown", 100.0)
    assert schedule.due("republish_lost", 100.0)
