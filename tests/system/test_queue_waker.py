"""The manager keeps a start queue that holds many messages from hibernating
(``manager/queue_waker.py``), and leaves a small one alone: asked of the broker itself,
whose queue processes are sampled where they run."""

from __future__ import annotations

from shared import topology
from tools import infra
from tools.harness import System, metric, wait_for

_SAMPLES = 40
_SAMPLE_EVERY_MS = 250


def hibernating_samples(rabbit: infra.RabbitNode, vhost: str, queue: str) -> int:
    """In how many of ``_SAMPLES`` looks, a quarter of a second apart, the queue's process was
    hibernating (sampled inside the broker: one ``rabbitmqctl eval``)."""
    expression = f"""
        {{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"{vhost}">>, queue, <<"{queue}">>)),
        Pid = amqqueue:get_pid(Q),
        Hibernating = {{current_function, {{erlang, hibernate, 3}}}},
        length([Pid || _ <- lists:seq(1, {_SAMPLES}),
                       begin timer:sleep({_SAMPLE_EVERY_MS}), erlang:process_info(Pid, current_function) end
                           =:= Hibernating]).
    """
    return int(rabbit.ctl("eval", expression, timeout=60).strip())


def test_a_big_start_queue_is_kept_awake_and_a_small_one_may_hibernate(
    system: System, rabbit: infra.RabbitNode, vhost: str
) -> None:
    # Given a manager that keeps awake the queues of pools with 3 live observers or more,
    # a pool "default" with 3 observers running and a pool "small" with 1
    # (counted every 2 s instead of 30 s, so the test need not wait)
    system.start_manager(
        ORCH_START_QUEUE_KEEP_AWAKE_FROM="3",
        ORCH_START_QUEUE_KEEP_AWAKE_S="0.2",
        ORCH_START_QUEUE_KEEP_AWAKE_READ_S="2",
    )
    system.start_service("svc-a", workers=10, ORCH_POOLS="default,small")
    ids = [system.create(f"big-{i}", args={"interval_s": 60, "emit": False})["id"] for i in range(3)]
    ids.append(system.create("small-0", args={"interval_s": 60, "emit": False}, pool="small")["id"])
    for oid in ids:
        system.wait_status(oid, "Processing")

    # When the manager has read the counts (the pools it keeps awake: one)
    wait_for(lambda: metric(system, "orch_start_queues_kept_awake") == 1, 60, "the waker to pick the big pool")

    # Then the big pool's queue process is never found hibernating, while the small pool's,
    # with nothing calling it, is (so the sampler does see hibernation)
    assert hibernating_samples(rabbit, vhost, topology.start_queue_name("default")) == 0
    assert hibernating_samples(rabbit, vhost, topology.start_queue_name("small")) > 0
