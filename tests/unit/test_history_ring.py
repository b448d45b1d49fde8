"""``manager.history.ring``: a bounded ring of samples, rates per minute from its totals, and
the columns ``GET /api/history`` answers."""

from __future__ import annotations

import sys
import tracemalloc

from manager.history.ring import History, Sample, ServiceLoad, per_minute

STATUSES = ("Created", "Processing", "Deleted")


def sample(at: float, created: int = 0, stopped: int = 0, failed: int = 0, failovers: int = 0, **kw: object) -> Sample:
    services = kw.get("services", ())
    assert isinstance(services, tuple)
    return Sample(at, (0, created - stopped, stopped), created, stopped, failed, failovers, services)


def test_the_ring_keeps_one_window_of_samples_and_drops_the_oldest() -> None:
    history = History(period_s=5, statuses=STATUSES, window_s=60)
    for i in range(100):
        history.add(sample(i * 5.0))
    assert len(history.samples) == 13  # 60 s of 5 s steps, both ends included
    assert history.samples[0].at == 87 * 5.0


def test_rates_per_minute_add_each_steps_increase_to_the_minute_of_its_later_sample() -> None:
    # Given totals sampled every 20 s across two minutes
    samples = [
        sample(100, created=0),
        sample(110, created=5),
        sample(125, created=9, stopped=2, failovers=3),  # minute 120
        sample(170, created=9, stopped=4, failovers=3),
    ]
    rates = per_minute(samples)
    assert rates["at"] == [60, 120]
    assert rates["created"] == [5, 4]
    assert rates["stopped"] == [0, 4]
    assert rates["failovers"] == [0, 3]


def test_a_total_that_went_down_is_no_negative_rate() -> None:
    # A Failed observer restarted leaves the Failed total lower: that is no failure "undone".
    rates = per_minute([sample(0, failed=3), sample(5, failed=2), sample(10, failed=4)])
    assert rates["failed"] == [2]


def test_a_missed_sample_loses_nothing() -> None:
    # The database was down between 10 and 70: the step after the gap carries the whole increase.
    rates = per_minute([sample(0, created=1), sample(70, created=11)])
    assert rates == {"at": [60], "created": [10], "stopped": [0], "failed": [0], "failovers": [0]}


def test_the_json_has_one_column_per_status_and_per_service_with_gaps_where_it_was_not_alive() -> None:
    history = History(period_s=5, statuses=STATUSES)
    a, b = ServiceLoad("id-a", "svc-a", 3, 10), ServiceLoad("id-b", "svc-b", 1, 5)
    history.add(sample(0, created=4, services=(a,)))
    history.add(sample(5, created=4, stopped=1, services=(a, b)))
    answer = history.as_json()
    assert answer["at"] == [0, 5]
    assert answer["observers"] == {"Created": [0, 0], "Processing": [4, 3], "Deleted": [0, 1]}
    assert answer["services"] == [
        {"id": "id-a", "name": "svc-a", "running": [3, 3], "workers": [10, 10]},
        {"id": "id-b", "name": "svc-b", "running": [None, 1], "workers": [None, 5]},
    ]
    assert answer["per_minute"]["stopped"] == [1]


def test_an_hour_of_samples_of_ten_services_costs_about_a_megabyte() -> None:
    # The figure docs/operations.md gives: 720 samples (5 s) of 5 statuses and 10 services.
    loads = tuple(ServiceLoad(f"{i:032x}", f"svc-{i}", 1000, 2000) for i in range(10))
    history = History(period_s=5, statuses=("a", "b", "c", "d", "e"))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(800):
        # Each sample's services are new objects, as the sampler makes them.
        services = tuple(ServiceLoad(s.id, s.name, s.running + i, s.workers) for s in loads)
        history.add(Sample(i * 5.0, (i, i + 1, i + 2, i + 3, i + 4), i, i, i, i, services))
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(history.samples) == 721
    assert used < 1_300_000, used
    print(f"{used / 1024:.0f} KiB for {len(history.samples)} samples", file=sys.stderr)
