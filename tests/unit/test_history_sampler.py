"""``manager.history.sampler``: one read of the database becomes one sample: statuses in the
enum's order (a status the read lacks is 0), totals for the rates, the alive services."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import async_sessionmaker

from manager.db.history import SampleRead
from manager.db.models import ObserverStatus
from manager.history.ring import ServiceLoad
from manager.history.sampler import Sampler


def read(statuses: dict[str, int], moved: int = 0, max_id: int | None = 100) -> SampleRead:
    return SampleRead(
        statuses=statuses,
        services=[("id-a", "svc-a", 3, 10)],
        max_id=max_id,
        moved_above_lo=moved,
        moved_above_next=moved,
    )


def test_a_read_becomes_a_sample_with_every_status_and_the_totals_of_the_rates() -> None:
    sampler = Sampler(async_sessionmaker(), period_s=5)
    sample = sampler.take(read({"Processing": 4, "Deleted": 2, "Failed": 1}), now=1000.0)
    assert sampler.history.statuses == tuple(s.value for s in ObserverStatus)
    counts = dict(zip(sampler.history.statuses, sample.statuses, strict=True))
    assert counts["Processing"] == 4 and counts["Created"] == 0
    assert (sample.created, sample.stopped, sample.failed) == (7, 2, 1)  # created: every row ever counted
    assert sample.services == (ServiceLoad("id-a", "svc-a", 3, 10),)


def test_failovers_count_from_the_first_sample_on() -> None:
    sampler = Sampler(async_sessionmaker(), period_s=5)
    assert sampler.take(read({}, moved=50), now=0.0).failovers == 0  # the history before it started
    assert sampler.take(read({}, moved=2, max_id=110), now=5.0).failovers == 2
