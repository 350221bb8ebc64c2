"""The options a StreamNative pulsar-spark user sets, each with its meaning.

pulsar-lite has no admin API; where one is needed, ``fake_admin`` answers Pulsar's REST
paths from what the test gives it, while the data comes from the real broker.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pulsar
import pytest
from pyspark.sql import SparkSession

from magnetar.broker import find_free_port
from tests.spark.conftest import (
    Batches,
    FakeAdmin,
    full,
    produce,
    read,
    run_available_now,
    texts,
)

pytestmark = pytest.mark.spark


def dead_admin_url() -> str:
    return f"http://127.0.0.1:{find_free_port()}"


def test_admin_url_where_nothing_answers_still_reads(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    """Set in every StreamNative program; on the embedded broker nothing answers there, and
    topics, partitions and schemas come through the binary protocol instead."""
    ids = produce(client, topic, [f"m{i}" for i in range(30)], batched=True)

    frame = read(spark, broker_url, topic=topic, **{"admin.url": dead_admin_url()})

    assert texts(frame) == [f"m{i}" for i in range(30)]
    assert frame.select("__messageId").distinct().count() == len(ids)


def test_topics_pattern_reads_the_topics_the_admin_api_lists(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, fake_admin: FakeAdmin
) -> None:
    for suffix, count in (("a", 12), ("b", 7), ("other", 3)):
        produce(client, f"{topic}-{suffix}", [f"{suffix}{i}" for i in range(count)])
    fake_admin.topics["public/default"] = [
        full(f"{topic}-a"),
        full(f"{topic}-b-partition-0"),  # a partitioned topic is listed by its partitions
        full(f"{topic}-other"),
    ]

    frame = read(
        spark,
        broker_url,
        topicsPattern=f"{topic}-[ab].*",
        **{"admin.url": fake_admin.url},
    )

    counts = {r["__topic"]: r["count"] for r in frame.groupBy("__topic").count().collect()}
    assert counts == {full(f"{topic}-a"): 12, full(f"{topic}-b"): 7}
    assert "/admin/v2/persistent/public/default" in fake_admin.requests


def test_topics_pattern_names_the_limit_when_no_admin_api_answers(
    spark: SparkSession, broker_url: str, topic: str
) -> None:
    with pytest.raises(Exception, match=r"topicsPattern needs Pulsar's admin API .*pulsar-lite"):
        read(spark, broker_url, topicsPattern=f"{topic}.*", **{"admin.url": dead_admin_url()})


def test_schema_comes_from_the_admin_api(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, fake_admin: FakeAdmin
) -> None:
    producer = client.create_producer(topic)
    for i in range(5):
        producer.send(json.dumps({"id": i, "name": f"n{i}"}).encode())
    producer.close()
    record = {
        "type": "record",
        "name": "Item",
        "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
    }
    fake_admin.schemas[full(topic)] = {"type": "JSON", "data": json.dumps(record)}

    frame = read(spark, broker_url, topic=topic, **{"admin.url": fake_admin.url})

    assert frame.columns[:2] == ["id", "name"]
    assert sorted((r.id, r.name) for r in frame.collect()) == [(i, f"n{i}") for i in range(5)]


def test_waiting_for_a_topic_that_does_not_exist_yet(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, fake_admin: FakeAdmin
) -> None:
    fake_admin.topics["public/default"] = []
    produce(client, topic, ["x", "y"])

    def create_later() -> None:
        time.sleep(1)
        fake_admin.topics["public/default"] = [full(topic)]

    threading.Thread(target=create_later, daemon=True).start()
    started = time.monotonic()
    frame = read(
        spark,
        broker_url,
        topic=topic,
        waitingForNonExistedTopic="true",
        **{"admin.url": fake_admin.url},
    )

    assert time.monotonic() - started >= 1
    assert texts(frame) == ["x", "y"]


def test_predefined_subscription_is_kept_at_the_query_progress(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    produce(client, topic, [f"m{i}" for i in range(12)])
    batches: Batches = {}
    subscription = f"{topic}-progress"
    run_available_now(
        spark,
        broker_url,
        tmp_path / "checkpoint",
        {
            "topic": topic,
            "startingOffsets": "earliest",
            "maxRecordsPerTrigger": "5",
            "predefinedSubscription": subscription,
        },
        batches,
    )
    assert [len(batches[i]) for i in sorted(batches)] == [5, 5, 2]

    # Kept after the query, at its committed progress: Spark commits a batch's offsets to
    # the source when it plans the next one, so the last batch (m10, m11) is still ahead.
    consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Failover)
    try:
        assert consumer.receive(5000).data() == b"m10"
    finally:
        consumer.close()


def test_subscriptions_made_with_a_prefix_are_removed_when_the_query_stops(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    produce(client, topic, [f"m{i}" for i in range(4)])
    batches: Batches = {}
    prefix = f"{topic}-mine"
    run_available_now(
        spark,
        broker_url,
        tmp_path / "checkpoint",
        {"topic": topic, "startingOffsets": "earliest", "subscriptionPrefix": prefix},
        batches,
    )
    assert sorted(v for b in batches.values() for v in b) == [f"m{i}" for i in range(4)]

    # Gone: subscribing by that name again starts a new subscription at the earliest message.
    consumer = client.subscribe(
        topic, f"{prefix}-{full(topic)}", initial_position=pulsar.InitialPosition.Earliest
    )
    try:
        assert consumer.receive(5000).data() == b"m0"
    finally:
        consumer.close()


def test_max_bytes_per_trigger_limits_micro_batches_by_payload_size(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    sent = [f"msg-{i:04d}" for i in range(25)]  # 8 bytes each
    produce(client, topic, sent)
    batches: Batches = {}

    run_available_now(
        spark,
        broker_url,
        tmp_path / "checkpoint",
        {
            "topic": topic,
            "startingOffsets": "earliest",
            "maxBytesPerTrigger": "80",
            "admin.url": dead_admin_url(),
        },
        batches,
    )

    assert [len(batches[i]) for i in sorted(batches)] == [10, 10, 5]
    assert [v for i in sorted(batches) for v in batches[i]] == sent


def test_max_bytes_per_trigger_needs_admin_url_as_with_streamnative(
    spark: SparkSession, broker_url: str, topic: str, tmp_path: Path
) -> None:
    with pytest.raises(Exception, match=r"admin\.url must be specified if maxBytesPerTrigger"):
        run_available_now(
            spark,
            broker_url,
            tmp_path / "checkpoint",
            {"topic": topic, "maxBytesPerTrigger": "100"},
            {},
        )


def test_client_and_reader_settings_are_passed_through(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    produce(client, topic, [f"m{i}" for i in range(40)], batched=True)

    frame = read(
        spark,
        broker_url,
        topic=topic,
        **{
            "pulsar.client.operationTimeoutMs": "20000",
            "pulsar.client.numIoThreads": "2",
            "pulsar.client.keepAliveIntervalSeconds": "15",  # Java-only tuning: no effect
            "pulsar.reader.receiverQueueSize": "7",
            "pulsar.reader.readerName": "spark-reader",
        },
    )

    assert texts(frame) == [f"m{i}" for i in range(40)]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("pulsar.client.proxyServiceUrl", "pulsar://proxy:6650", "cannot connect through a proxy"),
        ("pulsar.client.tlsTrustStorePath", "/x.jks", "Java KeyStores are Java-only"),
        ("pulsar.reader.startPaused", "true", "a paused reader would read nothing"),
        ("pulsar.reader.receiverQueueSize", "many", "must be an integer"),
        ("pulsar.admin.invalid", "x", "invalid not supported by pulsar"),
    ],
)
def test_settings_that_cannot_be_kept_are_refused_with_the_reason(
    spark: SparkSession, broker_url: str, topic: str, option: str, value: str, message: str
) -> None:
    with pytest.raises(Exception, match=message):
        read(spark, broker_url, topic=topic, **{option: value}).count()


def test_producer_settings_are_passed_through(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    frame = spark.createDataFrame([(f"v{i}",) for i in range(6)], "value string")

    frame.write.format("pulsar").option("service.url", broker_url).option("topic", topic).options(
        **{
            "pulsar.producer.batchingEnabled": "false",
            "pulsar.producer.blockIfQueueFull": "true",
            "pulsar.producer.maxPendingMessages": "100000",
            "pulsar.producer.sendTimeoutMs": "30000",
            "pulsar.producer.initialSubscriptionName": f"{topic}-initial",
        }
    ).mode("append").save()

    # The subscription existed before the first row: joining it now, even at "latest",
    # gets every row; and none was batched.
    consumer = client.subscribe(
        topic, f"{topic}-initial", initial_position=pulsar.InitialPosition.Latest
    )
    try:
        messages = [consumer.receive(5000) for _ in range(6)]
    finally:
        consumer.close()
    assert sorted(m.data() for m in messages) == [f"v{i}".encode() for i in range(6)]
    assert {m.message_id().batch_index() for m in messages} == {-1}
