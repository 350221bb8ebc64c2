"""Replaying a function over a range of history, compared with the live function."""

from __future__ import annotations

import base64
import time
import uuid
from pathlib import Path
from typing import Any

import pulsar
import pytest
from pyspark.sql import SparkSession

from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions
from magnetar.spark_connector import ReplayReport, replay
from tests.conftest import EXAMPLES
from tests.spark.conftest import full, id_json, produce, read, texts

pytestmark = pytest.mark.spark

EXCLAMATION = {
    "py": str(EXAMPLES / "exclamation.py"),
    "class_name": "exclamation.ExclamationFunction",
}


def run_live(client: pulsar.Client, config: FunctionConfig, count: int) -> list[Any]:
    """What the live function instance outputs for the first ``count`` inputs."""
    instance = FunctionInstance(config, client, InstanceOptions()).start()
    try:
        deadline = time.monotonic() + 30
        while instance.metrics.processed < count:
            assert time.monotonic() < deadline, "the live function did not finish in 30 s"
            time.sleep(0.05)
    finally:
        instance.stop()
        assert instance.wait(30)
    assert config.output is not None
    consumer = client.subscribe(
        config.output, "replay-test", initial_position=pulsar.InitialPosition.Earliest
    )
    try:
        return [consumer.receive(5000) for _ in range(count)]
    finally:
        consumer.close()


def as_record(value: bytes, key: Any, event_ms: int, properties: dict[str, str]) -> tuple[Any, ...]:
    return (bytes(value), key or None, event_ms or None, tuple(sorted(properties.items())))


def test_replay_of_a_range_equals_the_live_output_for_it(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    ids = []
    for i in range(30):  # keys, properties and event times vary, in batched entries
        ids += produce(
            client,
            topic,
            [f"hello-{i}"],
            batched=True,
            partition_key=f"key-{i % 4}",
            properties={"n": str(i)},
            event_timestamp=1_700_000_000_000 + i,
        )
    config = FunctionConfig(
        name=f"excl-{uuid.uuid4().hex[:6]}",
        inputs=[topic],
        output=f"{topic}-live",
        subscription_position="Earliest",
        **EXCLAMATION,
    )
    live = run_live(client, config, 30)
    in_range = {base64.b64encode(i.serialize()).decode() for i in ids[5:25]}
    expected = {
        as_record(m.data(), m.partition_key().encode() or None, m.event_timestamp(), m.properties())
        for m in live
        if m.properties()["__pfn_input_msg_id__"] in in_range
    }
    assert len(expected) == 20

    report = replay(
        spark,
        config,
        {
            "service.url": broker_url,
            "startingOffsets": id_json(topic, ids[5]),
            "endingOffsets": id_json(topic, ids[24]),
        },
        path=str(tmp_path / "replayed"),
    )

    assert report == ReplayReport(
        inputs=20,
        outputs=20,
        published=0,
        user_exceptions=0,
        system_exceptions=0,
        latest_exceptions=(),
    )
    rows = spark.read.parquet(str(tmp_path / "replayed")).collect()
    replayed = {
        as_record(
            r["value"],
            r["__key"] and bytes(r["__key"]),
            r["__eventTime"] and round(r["__eventTime"].timestamp() * 1000),
            r["__messageProperties"],
        )
        for r in rows
    }
    assert replayed == expected
    assert {r["__topic"] for r in rows} == {full(f"{topic}-live")}


def test_user_exceptions_are_counted_and_the_rest_is_written(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    produce(client, topic, ["a", "boom-1", "b", "c", "boom-2", "d"])
    config = FunctionConfig(
        name="fragile",
        inputs=[topic],
        py=str(EXAMPLES / "fragile.py"),
        class_name="fragile.FragileFunction",
    )

    report = replay(spark, config, {"service.url": broker_url}, to_topic=f"{topic}-out")

    assert (report.inputs, report.outputs, report.user_exceptions) == (6, 4, 2)
    assert len(report.latest_exceptions) == 2
    assert "ValueError: cannot handle 'boom-1'" in report.latest_exceptions[0]
    assert f"of {full(topic)}" in report.latest_exceptions[0]
    assert texts(read(spark, broker_url, topic=f"{topic}-out")) == ["A", "B", "C", "D"]


def test_published_messages_go_to_their_own_topic(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    produce(client, topic, ["x", "y"])
    config = FunctionConfig(
        name="publisher",
        inputs=[topic],
        py=str(EXAMPLES / "publish.py"),
        class_name="publish.PublishFunction",
        user_config={"publish-topic": f"{topic}-published"},
    )

    report = replay(spark, config, {"service.url": broker_url}, to_topic=f"{topic}-out")

    assert (report.inputs, report.outputs, report.published) == (2, 0, 2)
    published = read(spark, broker_url, topic=f"{topic}-published")
    assert texts(published) == ["x!", "y!"]
    assert {tuple(r["__messageProperties"].items()) for r in published.collect()} == {
        (("source", "publisher"),)
    }
    assert read(spark, broker_url, topic=f"{topic}-out").count() == 0
