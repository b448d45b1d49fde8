"""The broker configuration of deploy/kubernetes/rabbitmq-cluster.yaml on a real RabbitMQ 4.3
node, after what the RabbitMQ Cluster Operator mounts before it (issue 63, item 2).

The operator writes ``conf.d/10-operatorDefaults.conf`` (tests/vendor/rabbitmq-cluster-operator/
README.md; the operator's documentation lists its lines) and the cluster's additionalConfig as
``conf.d/90-userDefinedConfiguration.conf``, read after it; advancedConfig becomes
advanced.config. Peer discovery by the Kubernetes API is left out: there is none here. Among
the defaults is ``queue_master_locator``, a deprecated feature that deny-deprecated.conf denies:
the node must still boot, keep the denial and the consumer timeout, and take the product's
queues.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import pytest
import yaml

from shared import topology
from shared.topology import QueueType
from tools import infra
from tools.harness import REPO, free_port, unique
from tools.infra.brokers import selected_series

OPERATOR_DEFAULTS = """\
queue_master_locator = min-masters
disk_free_limit.absolute = 2GB
cluster_partition_handling = pause_minority
cluster_formation.target_cluster_size_hint = 3
cluster_name = orchestrator-rabbitmq
"""


@pytest.mark.skipif(selected_series() != "4.3", reason="the manifest pins RabbitMQ 4.3")
def test_a_43_node_boots_with_the_operators_defaults_then_ours(rabbit: infra.RabbitNode, tmp_path: Path) -> None:
    (cluster,) = yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "rabbitmq-cluster.yaml").read_text())
    config = cluster["spec"]["rabbitmq"]
    node = infra.RabbitNode(
        name=unique("orch-operator"),
        base=tmp_path / "rabbitmq",
        port=free_port(),
        dist_port=free_port(),
        user="orch",
        password="test-password",
        product_settings=False,  # only what the operator and the manifest give
        extra_conf=OPERATOR_DEFAULTS + "\n" + config["additionalConfig"],
        advanced_config=config["advancedConfig"],
    )
    try:
        node.start()
        timeout = node.ctl("eval", "application:get_env(rabbit, consumer_timeout).").strip()
        assert timeout == "{ok,315360000000}"
        # The call logs the feature's deprecation notice beside its answer, before or after it
        # (CI saw both): the answer is the line that is only true or false.
        permitted = node.ctl("eval", "rabbit_deprecated_features:is_permitted(queue_master_locator).")
        answers = [line.strip() for line in permitted.splitlines() if line.strip() in ("true", "false")]
        assert answers == ["false"], permitted
        tick = node.ctl("eval", "application:get_env(rabbit, channel_tick_interval).").strip()
        assert tick == "{ok,600000}"
        queue_types: tuple[QueueType, ...] = ("classic", "quorum")
        for queue_type in queue_types:
            node.add_vhost(queue_type)
            asyncio.run(_declare_everything(node.url_for(queue_type), queue_type))
    finally:
        node.destroy()


async def _declare_everything(url: str, queue_type: QueueType) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await topology.declare_common(channel, queue_type)
        await topology.declare_state_queue(channel, queue_type)
        await topology.declare_start_queue(channel, "default", queue_type)
