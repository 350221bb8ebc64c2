"""Partitioned input topics, created through the broker's admin API: a function's instances
consume every partition, and a Spark batch read takes them partition by partition."""

from __future__ import annotations

from collections import Counter

import pulsar
import pytest
from pyspark.sql import SparkSession

from tests.conftest import EXAMPLES
from tests.docker.conftest import (
    HostCluster,
    PulsarBroker,
    consume,
    produce,
    texts,
    wait_until,
)

# the first test here may also pull and start Pulsar (the session's broker)
pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

PARTITIONS = 3


def create_partitioned(broker: PulsarBroker, topic: str) -> list[str]:
    """Create ``topic`` with PARTITIONS partitions; returns the partitions' full names."""
    response = broker.admin(
        "PUT", f"/admin/v2/persistent/public/default/{topic}/partitions", json=PARTITIONS
    )
    assert response.status_code == 204, response.text
    metadata = broker.admin("GET", f"/admin/v2/persistent/public/default/{topic}/partitions")
    assert metadata.json()["partitions"] == PARTITIONS
    return [f"persistent://public/default/{topic}-partition-{i}" for i in range(PARTITIONS)]


def test_instances_consume_every_partition_of_their_input(
    host_cluster: HostCluster, pulsar_client: pulsar.Client, topic: str
) -> None:
    partitions = create_partitioned(host_cluster.broker, f"{topic}-in")
    host_cluster.start(2)
    name = f"parts-{topic}"
    host_cluster.create(
        name,
        EXAMPLES / "exclamation.py",
        className="exclamation.ExclamationFunction",
        inputs=[f"{topic}-in"],
        output=f"{topic}-out",
        parallelism=2,
        subscriptionPosition="Earliest",
    )
    wait_until(lambda: host_cluster.running_instances(name) == 2, 60, "2 instances running")

    sent = [f"p{i}" for i in range(60)]
    produce(pulsar_client, f"{topic}-in", sent, keyed=True)
    outputs = consume(
        pulsar_client, f"{topic}-out", lambda got: {f"{v}!" for v in sent} <= set(texts(got))
    )

    assert set(texts(outputs)) == {f"{v}!" for v in sent}
    assert {m.properties()["__pfn_input_topic__"] for m in outputs} == set(partitions)
    stats = host_cluster.get(f"/admin/v3/functions/public/default/{name}/status")
    assert sum(i["status"]["numReceived"] for i in stats["instances"]) >= len(sent)


@pytest.mark.spark
def test_spark_reads_a_partitioned_topic_partition_by_partition(
    spark: SparkSession, pulsar_broker: PulsarBroker, pulsar_client: pulsar.Client, topic: str
) -> None:
    partitions = create_partitioned(pulsar_broker, topic)
    sent = [f"s{i}" for i in range(90)]
    produce(pulsar_client, topic, sent, keyed=True)

    frame = (
        spark.read.format("pulsar")
        .option("service.url", pulsar_broker.service_url)
        .option("topic", topic)
        .load()
    )

    rows = frame.select("value", "__topic").collect()
    assert sorted(bytes(row.value).decode() for row in rows) == sorted(sent)
    per_partition = Counter(row["__topic"] for row in rows)
    assert set(per_partition) == set(partitions), per_partition  # every partition has some
    assert frame.rdd.getNumPartitions() >= PARTITIONS  # one read task per topic partition at least
