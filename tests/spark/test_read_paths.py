"""The native read path and the Python one read the same rows, row for row, on both brokers.

Every other Spark test reads the way ``magnetar.readPath`` defaults to (the native reader,
which ``make install`` builds; ``MAGNETAR_SPARK_READ_PATH=python`` runs them on the Python
client instead). Here each read is made both ways and the rows compared whole: values, keys,
topics, message ids, times and properties.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pulsar
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import Row, SparkSession

from tests.conftest import ApachePulsar
from tests.spark.conftest import Batches, full, id_json, position, read, run_available_now

pytestmark = pytest.mark.spark

PATHS = ("python", "native")


def both(spark: SparkSession, broker_url: str, **options: str) -> list[Row]:
    """The rows of one read on each path (in message order per topic), asserted equal."""
    reads = {}
    for path in PATHS:
        rows = read(spark, broker_url, **{"magnetar.readPath": path}, **options).collect()
        rows.sort(key=lambda row: (row["__topic"], position(row["__messageId"])))
        reads[path] = rows
    assert reads["native"] == reads["python"]
    return reads["native"]


def send_varied(client: pulsar.Client, topic: str, count: int, *, batched: bool) -> list[Any]:
    """``count`` messages, some with a key, properties or an event time; their ids."""
    producer = client.create_producer(
        topic,
        batching_enabled=batched,
        batching_max_messages=7,  # batches of several sizes, ranges end inside them
        batching_max_publish_delay_ms=20,
        block_if_queue_full=True,
    )
    ids: list[Any] = [None] * count

    def remember(index: int) -> Any:
        def on_sent(result: Any, message_id: Any) -> None:
            assert result == pulsar.Result.Ok, result
            ids[index] = message_id

        return on_sent

    for i in range(count):
        extra: dict[str, Any] = {}
        if i % 3:
            extra["partition_key"] = f"key-{i % 11}"
        if i % 4 == 1:
            extra["properties"] = {"n": str(i), "kind": "odd" if i % 2 else "even", "a": "x"}
        if i % 5 == 2:
            extra["event_timestamp"] = 1_700_000_000_000 + i
        producer.send_async(f"m{i}".encode(), remember(i), **extra)
    producer.flush()
    producer.close()
    assert all(message_id is not None for message_id in ids)
    return ids


def values(rows: list[Row]) -> list[str]:
    return [bytes(row.value).decode() for row in rows]


@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.brokers("lite", "apache")
def test_both_paths_read_every_column_alike(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, batched: bool
) -> None:
    send_varied(client, topic, 400, batched=batched)

    rows = both(spark, broker_url, topic=topic)

    assert values(rows) == [f"m{i}" for i in range(400)]
    assert rows[1]["__key"] == b"key-1"
    assert rows[1]["__messageProperties"] == {"a": "x", "kind": "odd", "n": "1"}
    assert rows[2]["__eventTime"] is not None
    assert rows[0]["__key"] is None and rows[0]["__eventTime"] is None


@pytest.mark.brokers("lite", "apache")
def test_both_paths_agree_on_ranges_inside_batches(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    ids = send_varied(client, topic, 300, batched=True)
    assert ids[13].batch_index() > 0 and ids[250].batch_index() > 0  # inside batches

    rows = both(
        spark,
        broker_url,
        topic=topic,
        startingOffsets=id_json(topic, ids[13]),
        endingOffsets=id_json(topic, ids[250]),
    )

    # The starting message is included, as the ending one (StreamNative's semantics).
    assert values(rows) == [f"m{i}" for i in range(13, 251)]


def test_both_paths_agree_on_publish_time_bounds(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=5)
    for i in range(30):
        producer.send(f"early-{i}".encode())
    time.sleep(0.05)
    since = int(time.time() * 1000)
    for i in range(30):
        producer.send(f"late-{i}".encode())
    producer.close()

    rows = both(spark, broker_url, topic=topic, startingTime=str(since))

    assert values(rows) == [f"late-{i}" for i in range(30)]


def test_streaming_micro_batches_agree(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    send_varied(client, topic, 250, batched=True)
    runs: dict[str, Batches] = {}
    for path in PATHS:
        runs[path] = {}
        options = {
            "topic": topic,
            "startingOffsets": "earliest",
            "maxRecordsPerTrigger": "100",
            "magnetar.readPath": path,
        }
        run_available_now(spark, broker_url, tmp_path / path, options, runs[path])

    assert runs["native"] == runs["python"]
    assert sum(len(batch) for batch in runs["native"].values()) == 250


def test_compressed_messages_are_read_on_by_the_python_client(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    plain = client.create_producer(topic, batching_enabled=False)
    for i in range(50):
        plain.send(f"plain-{i}".encode())
    plain.close()
    compressed = client.create_producer(
        topic, compression_type=pulsar.CompressionType.LZ4, batching_enabled=False
    )
    for i in range(50):
        compressed.send(f"lz4-{i}".encode() * 20)
    compressed.close()

    rows = both(spark, broker_url, topic=topic)

    assert values(rows) == [f"plain-{i}" for i in range(50)] + [f"lz4-{i}" * 20 for i in range(50)]


def test_the_native_path_says_what_it_cannot_read(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    client.create_producer(topic).send(b"one")
    frame = read(
        spark,
        broker_url,
        topic=topic,
        **{"magnetar.readPath": "native", "pulsar.reader.readCompacted": "true"},
    )

    with pytest.raises(PySparkException, match=r"native reader does not support pulsar\.reader"):
        frame.collect()
    assert read(spark, broker_url, topic=topic, **{"magnetar.readPath": "auto"}).count() == 1


def test_an_unknown_read_path_is_refused(spark: SparkSession, broker_url: str, topic: str) -> None:
    with pytest.raises(PySparkException, match=r"magnetar.readPath must be one of auto, native"):
        read(spark, broker_url, topic=topic, **{"magnetar.readPath": "fast"}).collect()


@pytest.mark.brokers("apache")
def test_both_paths_agree_on_a_partitioned_topic(
    spark: SparkSession,
    apache_pulsar: ApachePulsar,
    client: pulsar.Client,
    broker_url: str,
    topic: str,
) -> None:
    created = apache_pulsar.admin(
        "PUT", f"/admin/v2/persistent/public/default/{topic}/partitions", json=2
    )
    assert created.status_code == 204, created.text
    send_varied(client, topic, 120, batched=True)

    rows = both(spark, broker_url, topic=topic)

    assert sorted(values(rows)) == sorted(f"m{i}" for i in range(120))
    assert {row["__topic"] for row in rows} == {f"{full(topic)}-partition-{i}" for i in (0, 1)}


_READ_TWICE = textwrap.dedent(
    """
    import logging, sys
    from magnetar.spark_connector._batch import read_batches
    from magnetar.spark_connector._ranges import RangePartition, ReadSettings
    from magnetar.spark_connector._offsets import BEFORE_EARLIEST

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    settings = ReadSettings(service_url=sys.argv[1])
    for _ in range(2):
        batches = read_batches(RangePartition(sys.argv[2], BEFORE_EARLIEST, None), settings)
        print(sum(batch.num_rows for batch in batches))
    """
)


def test_without_the_native_reader_the_python_client_reads_and_says_so_once(
    client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    send_varied(client, topic, 30, batched=False)
    env = {
        **os.environ,
        "MAGNETAR_SPARK_NATIVE_READER": str(tmp_path / "not-built.so"),
        "MAGNETAR_SPARK_READ_PATH": "auto",
    }
    done = subprocess.run(
        [sys.executable, "-c", _READ_TWICE, broker_url, full(topic)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["30", "30"]
    said = [line for line in done.stderr.splitlines() if "native Pulsar reader" in line]
    assert len(said) == 1, done.stderr
    assert "not-built.so" in said[0] and "make install" in said[0]
