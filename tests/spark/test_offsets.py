"""Offsets as StreamNative takes them: MessageId.earliest / MessageId.latest in the JSON,
invalid combinations refused at once, "latest" looked up again at every evaluation."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pulsar
import pytest
from pyspark.sql import SparkSession

from tests.spark.conftest import Batches, full, id_json, produce, read, run_available_now, texts

pytestmark = pytest.mark.spark

LATEST = pulsar.MessageId.latest
EARLIEST = pulsar.MessageId.earliest


@pytest.mark.parametrize(
    ("option", "message_id", "message"),
    [
        ("startingOffsets", LATEST, "starting offset can't be latest"),
        ("endingOffsets", EARLIEST, "ending offset can't be earliest"),
    ],
    ids=["start-latest", "end-earliest"],
)
def test_bounds_that_select_nothing_are_refused_in_a_batch_read(
    spark: SparkSession,
    client: pulsar.Client,
    broker_url: str,
    topic: str,
    option: str,
    message_id: pulsar.MessageId,
    message: str,
) -> None:
    produce(client, topic, ["a"])
    started = time.monotonic()
    with pytest.raises(Exception, match=message):
        read(spark, broker_url, topic=topic, **{option: id_json(topic, message_id)}).count()
    assert time.monotonic() - started < 60  # never pollTimeoutMs


def test_earliest_and_latest_message_ids_as_bounds(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    sent = [f"m{i}" for i in range(20)]
    produce(client, topic, sent, batched=True)

    frame = read(
        spark,
        broker_url,
        topic=topic,
        startingOffsets=id_json(topic, EARLIEST),
        endingOffsets=id_json(topic, LATEST),
    )

    assert texts(frame) == sent


def test_a_start_after_the_end_is_refused(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    ids = produce(client, topic, ["a", "b", "c"])
    with pytest.raises(Exception, match=r"startingOffsets for .* is after its endingOffsets"):
        read(
            spark,
            broker_url,
            topic=topic,
            startingOffsets=id_json(topic, ids[2]),
            endingOffsets=id_json(topic, ids[0]),
        ).count()


def test_latest_is_looked_up_again_each_time_a_dataframe_is_evaluated(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    produce(client, topic, ["a", "b"])
    frame = read(spark, broker_url, topic=topic)
    assert frame.count() == 2

    produce(client, topic, ["c", "d", "e"])

    assert frame.count() == 5
    assert texts(frame) == ["a", "b", "c", "d", "e"]
    assert frame.select("__messageId").distinct().count() == 5


def test_streaming_start_at_message_id_latest(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    produce(client, f"{topic}-a", ["old-a"])
    produce(client, f"{topic}-b", ["old-b0", "old-b1"])
    batches: Batches = {}
    # Latest for a, earliest for b (a topic the JSON leaves out starts at the default, latest).
    starting = json.dumps(
        {**json.loads(id_json(f"{topic}-a", LATEST)), **json.loads(id_json(f"{topic}-b", EARLIEST))}
    )
    options = {"topics": f"{topic}-a,{topic}-b", "startingOffsets": starting}
    checkpoint = tmp_path / "checkpoint"

    run_available_now(spark, broker_url, checkpoint, options, batches)
    produce(client, f"{topic}-a", ["new-a"])
    run_available_now(spark, broker_url, checkpoint, options, batches)

    assert sorted(v for b in batches.values() for v in b) == ["new-a", "old-b0", "old-b1"]


def test_starting_time_per_topic(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    produce(client, f"{topic}-a", ["a-early"])
    produce(client, f"{topic}-b", ["b-early"])
    time.sleep(0.05)
    since = int(time.time() * 1000)
    produce(client, f"{topic}-a", ["a-late"])
    produce(client, f"{topic}-b", ["b-late"])

    frame = read(
        spark,
        broker_url,
        topics=f"{topic}-a,{topic}-b",
        startingTime=json.dumps({full(f"{topic}-a"): since, f"{topic}-b": 0}),
    )

    assert sorted(texts(frame)) == ["a-late", "b-early", "b-late"]
