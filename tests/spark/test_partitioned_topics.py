"""A partitioned topic, created through Apache Pulsar's admin API, read partition by partition."""

from __future__ import annotations

from collections import Counter

import pulsar
import pytest
from pyspark.sql import SparkSession

from tests.conftest import ApachePulsar
from tests.spark.conftest import full, read

pytestmark = [pytest.mark.spark, pytest.mark.brokers("apache")]

PARTITIONS = 3


def test_a_partitioned_topic_is_read_partition_by_partition(
    spark: SparkSession,
    apache_pulsar: ApachePulsar,
    client: pulsar.Client,
    broker_url: str,
    topic: str,
) -> None:
    created = apache_pulsar.admin(
        "PUT", f"/admin/v2/persistent/public/default/{topic}/partitions", json=PARTITIONS
    )
    assert created.status_code == 204, created.text
    producer = client.create_producer(topic, batching_enabled=False)
    sent = [f"s{i}" for i in range(90)]
    for index, value in enumerate(sent):  # keys spread the messages over the partitions
        producer.send(value.encode(), partition_key=f"key-{index}")
    producer.close()

    frame = read(spark, broker_url, topic=topic)

    rows = frame.select("value", "__topic").collect()
    assert sorted(bytes(row.value).decode() for row in rows) == sorted(sent)
    per_partition = Counter(row["__topic"] for row in rows)
    assert set(per_partition) == {f"{full(topic)}-partition-{i}" for i in range(PARTITIONS)}
    assert frame.rdd.getNumPartitions() == PARTITIONS  # one read task per topic partition
