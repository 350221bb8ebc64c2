"""A local Spark session for the whole run, and helpers to fill and read topics."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pulsar
import pytest
from pyspark.sql import DataFrame, SparkSession

from magnetar.spark_connector import PulsarDataSource


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """``local[2]`` with the ``pulsar`` data source registered; started once (~10 s)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("magnetar-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(PulsarDataSource)
    yield session
    session.stop()


def full(topic: str) -> str:
    return f"persistent://public/default/{topic}"


def produce(
    client: pulsar.Client,
    topic: str,
    values: Sequence[str],
    *,
    batched: bool = False,
    **send: Any,
) -> list[Any]:
    """Send ``values`` and return their message ids (in order)."""
    producer = client.create_producer(
        topic,
        batching_enabled=batched,
        batching_max_messages=10,  # several batches even for small tests
        batching_max_publish_delay_ms=50,
        block_if_queue_full=True,
    )
    ids: list[Any] = [None] * len(values)

    def remember(index: int) -> Any:
        def on_sent(result: Any, message_id: Any) -> None:
            assert result == pulsar.Result.Ok, result
            ids[index] = message_id

        return on_sent

    for index, value in enumerate(values):
        producer.send_async(value.encode(), remember(index), **send)
    producer.flush()
    producer.close()
    assert all(i is not None for i in ids)
    return ids


def read(spark: SparkSession, broker_url: str, **options: str) -> DataFrame:
    return spark.read.format("pulsar").option("service.url", broker_url).options(**options).load()


def position(serialized: bytes) -> tuple[int, int, int]:
    message_id = pulsar.MessageId.deserialize(bytes(serialized))
    return (message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())


def texts(frame: DataFrame) -> list[str]:
    """The values of a read, decoded, in message order within each topic."""
    rows = frame.select("value", "__topic", "__messageId").collect()
    rows.sort(key=lambda row: (row["__topic"], position(row["__messageId"])))
    return [bytes(row.value).decode() for row in rows]


def id_json(topic: str, message_id: Any) -> str:
    """``{"<topic>": [signed bytes]}``, as StreamNative users write offsets."""
    signed = [b - 256 if b > 127 else b for b in message_id.serialize()]
    return json.dumps({full(topic): signed})
