"""A local Spark session for the whole run, and helpers to fill and read topics."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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


Batches = dict[int, list[str]]


def run_available_now(
    spark: SparkSession,
    broker_url: str,
    checkpoint: Path,
    options: dict[str, str],
    batches: Batches,
    fail_on: Callable[[int], bool] = lambda batch_id: False,
) -> None:
    """Run a query with Trigger.AvailableNow until it stops; each micro-batch's values go to
    ``batches[batch_id]`` (a re-run batch overwrites, as an idempotent sink would)."""

    def record(frame: DataFrame, batch_id: int) -> None:
        batches[batch_id] = texts(frame)
        if fail_on(batch_id):
            raise RuntimeError(f"injected failure in batch {batch_id}")

    stream = (
        spark.readStream.format("pulsar")
        .option("service.url", broker_url)
        .options(**options)
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(record)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
    finally:
        query.stop()


class FakeAdmin:
    """The parts of Pulsar's admin REST API the connector calls, answering from dicts the
    test fills: pulsar-lite has no admin API, and the connector's admin client is a seam
    these tests own."""

    def __init__(self) -> None:
        self.topics: dict[str, list[str]] = {}
        """namespace ("tenant/ns") -> full names of its topics."""
        self.schemas: dict[str, dict[str, Any]] = {}
        """full topic name -> the schema answer (type, data, properties)."""
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _answer(self, path: str) -> tuple[int, Any]:
        self.requests.append(path)
        parts = path.strip("/").split("/")
        if parts[:3] == ["admin", "v2", "persistent"] and len(parts) in (5, 6):
            namespace = "/".join(parts[3:5])
            if namespace not in self.topics:
                return 404, {"reason": "Namespace does not exist"}
            return 200, [] if len(parts) == 6 else self.topics[namespace]
        if parts[:3] == ["admin", "v2", "schemas"] and len(parts) == 7:
            topic = "persistent://" + "/".join(parts[3:6])
            if topic in self.schemas:
                return 200, self.schemas[topic]
            return 404, {"reason": "Schema not found"}
        return 404, {"reason": f"no such path {path}"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = fake._answer(self.path)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        return Handler

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def fake_admin() -> Iterator[FakeAdmin]:
    admin = FakeAdmin()
    yield admin
    admin.close()
