"""Writing to Pulsar: batch and streaming, to the topic option or each row's __topic."""

from __future__ import annotations

import datetime
from pathlib import Path

import pulsar
import pytest
from pyspark.sql import SparkSession

from tests.spark.conftest import full, produce, read, texts

pytestmark = pytest.mark.spark

EVENT_MS = 1_700_000_000_250


def received(client: pulsar.Client, topic: str, count: int) -> list[pulsar.Message]:
    """``count`` messages from the start of ``topic``, read with a plain consumer."""
    consumer = client.subscribe(
        topic, "writer-check", initial_position=pulsar.InitialPosition.Earliest
    )
    try:
        messages = [consumer.receive(5000) for _ in range(count)]
        with pytest.raises(pulsar.Timeout):
            consumer.receive(300)
    finally:
        consumer.close()
    return messages


def test_batch_write_sends_value_key_event_time_and_properties(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    event_time = datetime.datetime.fromtimestamp(EVENT_MS / 1000)
    frame = spark.createDataFrame(
        [
            ("one", "k1", event_time, {"color": "red"}),
            ("two", None, None, None),
        ],
        "value string, __key string, __eventTime timestamp, __messageProperties map<string,string>",
    )

    frame.write.format("pulsar").option("service.url", broker_url).option("topic", topic).mode(
        "append"
    ).save()

    by_value = {m.data(): m for m in received(client, topic, 2)}
    one, two = by_value[b"one"], by_value[b"two"]
    assert one.partition_key() == "k1"
    assert one.event_timestamp() == EVENT_MS
    assert one.properties() == {"color": "red"}
    assert two.partition_key() == ""
    assert two.event_timestamp() == 0
    assert two.properties() == {}


def test_round_trip_through_a_read_keeps_everything(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    sent = [f"m{i}" for i in range(40)]
    produce(
        client,
        topic,
        sent,
        batched=True,
        partition_key="k",
        properties={"p": "v"},
        event_timestamp=EVENT_MS,
    )
    source = read(spark, broker_url, topic=topic)

    # The read's own columns (__topic, __messageId, __publishTime) come along; the option wins.
    source.write.format("pulsar").option("service.url", broker_url).option(
        "topic", f"{topic}-copy"
    ).mode("append").save()

    copy = read(spark, broker_url, topic=f"{topic}-copy")
    assert texts(copy) == sent
    assert {
        (bytes(r["__key"]), r["__eventTime"], tuple(r["__messageProperties"].items()))
        for r in copy.collect()
    } == {(b"k", datetime.datetime.fromtimestamp(EVENT_MS / 1000), (("p", "v"),))}


def test_each_row_goes_to_its_topic_column(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    rows = [(f"a{i}", f"{topic}-a") for i in range(5)] + [(b"b0", full(f"{topic}-b"))]
    frame = spark.createDataFrame(
        [(v.encode() if isinstance(v, str) else v, t) for v, t in rows],
        "value binary, __topic string",
    )

    frame.write.format("pulsar").option("service.url", broker_url).mode("append").save()

    # Spark splits the rows among tasks: each topic gets them all, in no particular order.
    assert sorted(texts(read(spark, broker_url, topic=f"{topic}-a"))) == [f"a{i}" for i in range(5)]
    assert texts(read(spark, broker_url, topic=f"{topic}-b")) == ["b0"]


def test_streaming_write_copies_a_topic(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    sent = [f"s{i}" for i in range(30)]
    produce(client, topic, sent, partition_key="key", properties={"n": "1"})
    stream = (
        spark.readStream.format("pulsar")
        .option("service.url", broker_url)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
    )

    query = (
        stream.writeStream.format("pulsar")
        .option("service.url", broker_url)
        .option("topic", f"{topic}-copy")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)

    copied = received(client, f"{topic}-copy", 30)
    assert [m.data().decode() for m in copied] == sent
    assert {(m.partition_key(), tuple(m.properties().items())) for m in copied} == {
        ("key", (("n", "1"),))
    }


@pytest.mark.parametrize(
    ("schema", "mode", "message"),
    [
        (
            "value string",
            "overwrite",
            r"Pulsar topics are append-only: write with mode\('append'\)",
        ),
        ("__key string", "append", "Schema should have at least one non-key/non-topic field"),
        ("value string, __key int", "append", "__key attribute type must be a string or binary"),
        (
            "value string, __eventTime string",
            "append",
            "__eventTime attribute type must be a bigint or timestamp",
        ),
        ("value string, __topic int", "append", "Topic type must be a string"),
        (
            "value decimal(10,2)",
            "append",
            r"a value column of type decimal\(10,2\) cannot be written to Pulsar",
        ),
    ],
)
def test_bad_frames_are_refused_with_the_reason(
    spark: SparkSession, broker_url: str, topic: str, schema: str, mode: str, message: str
) -> None:
    """StreamNative's checks and messages, before any row is sent."""
    frame = spark.createDataFrame([], schema)
    with pytest.raises(Exception, match=message):
        frame.write.format("pulsar").option("service.url", broker_url).option("topic", topic).mode(
            mode
        ).save()


def test_without_topic_option_or_column_nothing_is_sent(
    spark: SparkSession, broker_url: str
) -> None:
    frame = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match="topic option required when no '__topic' attribute"):
        frame.write.format("pulsar").option("service.url", broker_url).mode("append").save()
