"""The broker's consumer_timeout must never restart an observer (issue #2 test 13), and the
broker settings that ensure it are the same wherever the project runs a broker.

Two extra brokers of the series under test: one with the project's settings (the timeout
lifted in ``orchestrator.conf``), one with a user's ``consumer_timeout = 5000`` instead. On
3.10 and 4.0 the second closes the channel of a delivery held past 5 s, and the service must
name the setting; 4.3's classic queues time out no consumer, so there the observer must run
on as on the first. A channel checks its consumer timeout only on its tick, and the shipped
config makes that tick ten minutes: both brokers get a one-second tick at runtime (as
RabbitMQ's own consumer-timeout suite does), or a timeout could not fire within the test."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shared import topology
from shared.messages import StartObserver
from tools import infra
from tools.harness import Proc, System, free_port, probe_args, read_ticks, wait_for
from tools.infra.rabbitmq import SHIPPED_ADVANCED_CONFIG

LIFTED_MS = 315_360_000_000  # deploy/rabbitmq/orchestrator.conf: ten years

HOLD_S = 15  # three consumer timeouts, fifteen channel ticks
TIMEOUT_MS = 5000


def test_the_project_broker_runs_the_advanced_config_compose_ships(rabbit: infra.RabbitNode) -> None:
    # compose.yaml mounts deploy/rabbitmq/advanced.config; tools/infra copies it for `make
    # run`, the tests and the benches, so what is measured and tested here is what ships.
    assert rabbit.advanced_config_file.read_text() == SHIPPED_ADVANCED_CONFIG.read_text()


def test_the_project_broker_wakes_its_channels_every_ten_minutes(rabbit: infra.RabbitNode) -> None:
    # Read back from the running node: a term RabbitMQ did not take (a typo, a wrong
    # section) would leave its one-minute default in place without a word.
    restart = "a broker started before this setting: `python -m tools.infra down`, then `up`"
    tick = rabbit.ctl("eval", "application:get_env(rabbit, channel_tick_interval).").strip()
    assert tick == "{ok,600000}", restart
    assert rabbit.ctl("eval", "application:get_env(rabbit, consumer_timeout).").strip() == f"{{ok,{LIFTED_MS}}}"


def test_reusing_a_broker_started_with_other_settings_says_how_to_apply_them(
    rabbit: infra.RabbitNode, capsys: pytest.CaptureFixture[str]
) -> None:
    # A checkout pulled under a running broker: `up` reuses the node (something may be using
    # it) and names the command that applies the new settings instead of staying silent.
    dataclasses.replace(rabbit, product_settings=False).start()
    said = capsys.readouterr().err
    assert "started with other settings" in said and "python -m tools.infra down" in said
    assert rabbit.is_running()
    rabbit.start()
    assert "other settings" not in capsys.readouterr().err


def broker(tmp_path: Path, name: str, lift: bool) -> infra.RabbitNode:
    node = infra.RabbitNode(
        name=name,
        base=tmp_path / name,
        port=free_port(),
        dist_port=free_port(),
        user="orch",
        password="test-password",
        extra_conf="" if lift else f"consumer_timeout = {TIMEOUT_MS}",
        product_settings=lift,
    )
    node.start()
    # Read by every channel when it opens: set before the service connects.
    node.ctl("eval", "application:set_env(rabbit, channel_tick_interval, 1000).")
    assert node.ctl("eval", "application:get_env(rabbit, channel_tick_interval).").strip() == "{ok,1000}"
    timeout = node.ctl("eval", "application:get_env(rabbit, consumer_timeout).").strip()
    assert timeout == f"{{ok,{LIFTED_MS if lift else TIMEOUT_MS}}}"
    return node


def has_text(proc: Proc, text: str) -> bool:
    return text in proc.text()


@pytest.mark.slow
def test_observer_outlives_the_consumer_timeout(tmp_path: Path, plugin_path: Path) -> None:
    with ThreadPoolExecutor(2) as pool:  # each boot mostly waits: start both at once
        lifted, plain = pool.map(functools.partial(broker, tmp_path), ("acklifted", "ackplain"), (True, False))
    systems = {
        "lifted": System(amqp_url=lifted.url, database_url="unused", workdir=tmp_path),
        "plain": System(amqp_url=plain.url, database_url="unused", workdir=tmp_path),
    }
    try:
        logs = {}
        for label, system in systems.items():
            # The test plug-in's probe: a ticker that logs each tick
            service = system.start_service(f"svc-{label}", workers=2, PYTHONPATH=str(plugin_path))
            wait_for(functools.partial(has_text, service, "broker session open"), 30, "session")
            logs[label] = tmp_path / f"{label}.ticks"
            start = StartObserver(
                observer_id=uuid.uuid4(),
                name=f"long-{label}",
                kind="probe",
                args=probe_args(logs[label], 1),
            )
            system.publish_raw(topology.start_queue_name("default"), start.encode())
        began = time.monotonic()

        plain_service = systems["plain"].procs[0]
        if plain.install.series != "4.3":
            # A user's short timeout closes the channel, and the service names the setting
            wait_for(lambda: "consumer_timeout" in plain_service.text(), HOLD_S, "the ack-timeout error")
            assert "delivery acknowledgement" in plain_service.text()
            assert "consumer_timeout = 315360000000" in plain_service.text()

        # With the project's config (and on 4.3 even without it) the observer is never interrupted
        time.sleep(max(0.0, HOLD_S - (time.monotonic() - began)))
        uninterrupted = ["lifted"] + (["plain"] if plain.install.series == "4.3" else [])
        for label in uninterrupted:
            service = systems[label].procs[0]
            ticks = read_ticks(logs[label])
            assert len(ticks) >= HOLD_S - 5, label
            gaps = [b[3] - a[3] for a, b in itertools.pairwise(ticks)]
            assert max(gaps) < 5, f"{label}: the observer was interrupted (longest gap {max(gaps):.1f}s)"
            assert "session lost" not in service.text(), label
            assert "redelivered=True" not in service.text(), label
    finally:
        for system in systems.values():
            system.stop_all()
        lifted.stop()
        plain.stop()
