"""The benches' pure parts (``bench.idle_floor``, ``bench.broker_work``, ``bench.leader_work``,
``bench.scale``): how
they read the broker's counters, and that the cost curve runs the product at its defaults."""

from __future__ import annotations

from bench import broker_work, figures, leader_work
from bench.broker_work import busy_seconds
from bench.scale import SCALE_ENV
from bench.scenarios import BENCH_ENV
from manager.settings import ManagerSettings
from observer_service.settings import ServiceSettings
from tools.harness import FAST_ENV


def test_idle_floor_sums_microstate_accounting_by_activity_without_sleep() -> None:
    printed = """#{{dirty_cpu_scheduler,gc} => 920470,
  {scheduler,sleep} => 119830360,
  {dirty_cpu_scheduler,emulator} => 1164814,
  {scheduler,emulator} => 82895,
  {aux,other} => 17}"""
    assert busy_seconds(printed) == {
        "dirty_cpu_scheduler emulator": 1.16,
        "dirty_cpu_scheduler gc": 0.92,
        "scheduler emulator": 0.08,
    }


def test_broker_work_reads_reductions_collections_thread_states_and_the_traced_heap() -> None:
    printed = """["kind {rabbit_channel,init,1} reductions=3563695 processes=382 max_heap_words=229376",
 "kind {rabbit_prequeue,init,1} reductions=400593 processes=9 max_heap_words=137522381",
 "gc collections=1550 reclaimed_words=17065984",
 "msacc #{{scheduler,sleep} => 7381565,{dirty_cpu_scheduler,gc} => 33357000,{scheduler,emulator} => 45652000}",
 "traced minor=15 major=7 ns=32708000000"]"""
    assert broker_work.parse(printed, "rabbit_prequeue:init/1") == [
        {"process": "rabbit_channel:init/1", "reductions": 3563695, "processes": 382, "max_heap_mib": 1.8},
        {"process": "rabbit_prequeue:init/1", "reductions": 400593, "processes": 9, "max_heap_mib": 1049.2},
        {"process": "garbage collection (all)", "collections": 1550, "reclaimed_mib": 130.2},
        {"process": "thread states (s)", "scheduler emulator": 45.65, "dirty_cpu_scheduler gc": 33.36},
        {"process": "collections of rabbit_prequeue:init/1", "minor": 15, "major": 7, "seconds": 32.708},
    ]


def test_leader_work_reads_each_leader_and_counts_ra_counters_only_for_a_leader_that_stayed() -> None:
    printed = """[{<<"orch.start.default">>,'orch-2a7038-c1@localhost',18914,[2,0,12,12]},
 {<<"orch.start.default.1">>,'orch-2a7038-c2@localhost',19449,
  [30,4,9,7]},
 {<<"orch.start.default.2">>,'orch-2a7038-c3@localhost',500,[]}]"""
    before = leader_work.parse(printed)
    assert before["orch.start.default.1"] == leader_work.Leader(
        "orch-2a7038-c2@localhost",
        19449,
        {"commands": 30, "command_flushes": 4, "rpcs_sent": 9, "msgs_sent": 7},
    )
    assert before["orch.start.default.2"].counters == {}
    after = leader_work.parse(
        """[{<<"orch.start.default">>,'orch-2a7038-c1@localhost',20914,[42,10,52,22]},
 {<<"orch.start.default.1">>,'orch-2a7038-c1@localhost',700,[5,1,3,3]}]"""
    )
    done = leader_work.work(before, after)
    assert done["orch.start.default"] == {
        "node": "orch-2a7038-c1@localhost",
        "reductions": 2000,
        "commands": 40,
        "command_flushes": 10,
        "rpcs_sent": 40,
        "msgs_sent": 10,
        "elected": False,
    }
    # Its leader moved: the reductions count from the election, the counters not at all.
    assert done["orch.start.default.1"] == {"node": "orch-2a7038-c1@localhost", "reductions": 700, "elected": True}
    assert leader_work.batch_line(done["orch.start.default"]) == (
        "40 commands in 10 batches (4.0 per batch), 40 rpcs, 10 msgs sent"
    )
    assert leader_work.batch_line(done["orch.start.default.1"]) == "no Ra counters"


def test_metrics_samples_are_read_whose_labels_hold_a_space() -> None:
    page = """# HELP orch_handovers_total Observers the balancer asked a service to hand over
# TYPE orch_handovers_total counter
orch_handovers_total{reason="even load"} 250.0
orch_handovers_total{reason="drain"} 3.0
orch_service_observers_running 10499.0
"""
    assert figures.samples(page) == [
        ('orch_handovers_total{reason="even load"}', 250.0),
        ('orch_handovers_total{reason="drain"}', 3.0),
        ("orch_service_observers_running", 10499.0),
    ]


def test_the_cost_curve_runs_the_product_at_its_default_settings() -> None:
    """``make bench-scale`` measures the system as a user runs it: none of the test harness's
    fast clocks nor ``make bench``'s timings may reach it, only warnings-only logging."""
    for name in FAST_ENV.keys() | BENCH_ENV.keys():
        if name == "ORCH_LOG_LEVEL":
            continue
        setting = name.removeprefix("ORCH_").lower()
        models = [model for model in (ServiceSettings, ManagerSettings) if setting in model.model_fields]
        assert models, f"{name} is not a setting"
        default = models[0].model_fields[setting].default
        assert float(SCALE_ENV[name]) == float(default), name
    assert SCALE_ENV["ORCH_HEARTBEAT_S"] == "5.0" and SCALE_ENV["ORCH_REPAIR_INTERVAL_S"] == "1.0"
    assert SCALE_ENV["ORCH_LOG_LEVEL"] == "WARNING"
