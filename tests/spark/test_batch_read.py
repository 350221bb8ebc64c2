"""Batch reads: exact counts, every column, ranges by message id and publish time."""

from __future__ import annotations

import datetime
import time

import pulsar
import pytest
from pyspark.sql import SparkSession

from tests.spark.conftest import full, id_json, produce, read, texts

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.brokers("lite", "apache")
def test_reads_every_message_exactly_once(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, batched: bool
) -> None:
    sent = [f"m{i}" for i in range(300)]
    produce(client, topic, sent, batched=batched)

    frame = read(spark, broker_url, topic=topic)

    assert frame.count() == 300
    assert frame.select("__messageId").distinct().count() == 300
    assert texts(frame) == sent


def test_columns_carry_key_properties_and_times(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    before_ms = int(time.time() * 1000)
    producer = client.create_producer(topic)
    with_all = producer.send(
        b"\x00binary\xff",
        partition_key="user-1",
        properties={"origin": "test", "n": "1"},
        event_timestamp=1_700_000_000_123,
    )
    bare = producer.send(b"plain")
    producer.close()
    after_ms = int(time.time() * 1000)

    frame = read(spark, broker_url, topic=topic)
    assert frame.columns == [
        "value",
        "__key",
        "__topic",
        "__messageId",
        "__publishTime",
        "__eventTime",
        "__messageProperties",
    ]
    rows = {bytes(row.value): row for row in frame.collect()}

    first = rows[b"\x00binary\xff"]
    assert first["__key"] == b"user-1"
    assert first["__topic"] == full(topic)
    assert first["__messageId"] == with_all.serialize()
    assert first["__eventTime"] == datetime.datetime.fromtimestamp(1_700_000_000.123)
    assert first["__messageProperties"] == {"origin": "test", "n": "1"}
    published_ms = first["__publishTime"].timestamp() * 1000
    assert before_ms - 1 <= published_ms <= after_ms + 1

    second = rows[b"plain"]
    assert second["__key"] is None
    assert second["__eventTime"] is None
    assert second["__messageProperties"] == {}
    assert second["__messageId"] == bare.serialize()


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
def test_range_by_message_ids_includes_both_ends(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, batched: bool
) -> None:
    sent = [f"m{i}" for i in range(100)]
    ids = produce(client, topic, sent, batched=batched)

    frame = read(
        spark,
        broker_url,
        topic=topic,
        startingOffsets=id_json(topic, ids[15]),
        endingOffsets=id_json(topic, ids[64]),
    )
    assert texts(frame) == sent[15:65]

    # Only one end given: the other is the earliest / the latest message.
    assert (
        texts(read(spark, broker_url, topic=topic, endingOffsets=id_json(topic, ids[9])))
        == (sent[:10])
    )
    tail = read(spark, broker_url, topic=topic, startingOffsets=id_json(topic, ids[90]))
    assert texts(tail) == sent[90:]


def test_range_by_publish_time(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    produce(client, topic, [f"early{i}" for i in range(10)])
    time.sleep(0.05)
    since = int(time.time() * 1000)
    produce(client, topic, [f"middle{i}" for i in range(10)])
    time.sleep(0.05)
    until = int(time.time() * 1000)
    time.sleep(0.01)
    produce(client, topic, [f"late{i}" for i in range(10)])

    frame = read(spark, broker_url, topic=topic, startingTime=str(since), endingTime=str(until))

    assert texts(frame) == [f"middle{i}" for i in range(10)]


@pytest.mark.brokers("lite", "apache")
def test_several_topics_one_partition_each(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    produce(client, f"{topic}-a", [f"a{i}" for i in range(40)], batched=True)
    produce(client, f"{topic}-b", [f"b{i}" for i in range(25)])

    frame = read(spark, broker_url, topics=f"{topic}-a, {topic}-b")

    assert frame.rdd.getNumPartitions() == 2
    counts = {row["__topic"]: row["count"] for row in frame.groupBy("__topic").count().collect()}
    assert counts == {full(f"{topic}-a"): 40, full(f"{topic}-b"): 25}
    assert texts(frame) == [f"a{i}" for i in range(40)] + [f"b{i}" for i in range(25)]


def test_empty_topic_reads_as_no_rows(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    client.create_producer(f"{topic}-empty").close()  # exists, holds nothing
    produce(client, f"{topic}-full", ["x", "y"])

    assert read(spark, broker_url, topic=f"{topic}-empty").count() == 0
    assert read(spark, broker_url, topic=f"{topic}-never-written").count() == 0
    both = read(spark, broker_url, topics=f"{topic}-empty,{topic}-full")
    assert texts(both) == ["x", "y"]


def test_an_end_past_the_last_message_reads_what_is_there_unless_told_to_fail(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    """StreamNative's default failOnDataLoss=false: a warning, and the messages there; with
    true, an error when the query is planned, not after pollTimeoutMs."""
    ids = produce(client, topic, ["a", "b", "c"])
    beyond = pulsar.MessageId(-1, ids[-1].ledger_id(), ids[-1].entry_id() + 10, -1)
    options = {"endingOffsets": id_json(topic, beyond)}

    assert texts(read(spark, broker_url, topic=topic, **options)) == ["a", "b", "c"]

    started = time.monotonic()
    with pytest.raises(Exception, match=r"after its last message .* failOnDataLoss=false"):
        read(spark, broker_url, topic=topic, failOnDataLoss="true", **options).count()
    assert time.monotonic() - started < 60  # not pollTimeoutMs (120 s)
