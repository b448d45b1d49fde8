"""``manager.background``: the schedule of the background steps."""

from __future__ import annotations

from manager.background import BackgroundLoops, StepSchedule
from shared.settings import ManagerSettings


def test_background_steps_with_long_thresholds_run_at_a_quarter_of_them() -> None:
    # Given the default thresholds: re-stop after 10 s, lost starts after 60 s
    loops = BackgroundLoops.__new__(BackgroundLoops)
    loops.settings = ManagerSettings()
    schedule = StepSchedule(loops._periods())
    assert schedule.periods["restop"] == 2.5 and schedule.periods["republish_lost"] == 15.0
    assert schedule.periods["judge_heartbeats"] == 3.75  # a quarter of 3 heartbeats of 5 s
    assert schedule.periods["fold_counts"] == 5.0  # readers add up what is not folded yet
    assert all(callable(getattr(loops, step, None)) for step in schedule.periods)  # each names a step

    # A step with a period runs, then not again until the period passed
    assert schedule.due("restop", 100.0)
    schedule.ran("restop", 100.0)
    assert not schedule.due("restop", 102.0) and schedule.due("restop", 102.5)
    # A step without one runs every pass; a step that failed (not marked ran) runs next pass
    schedule.ran("describe_unknown", 100.0)
    assert schedule.due("describe_unknown", 100.0)
    assert schedule.due("republish_lost", 100.0)
