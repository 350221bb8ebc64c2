"""Writing rows to Pulsar, in batch and streaming queries.

Each Spark task sends its rows asynchronously (batched) and returns once the broker has
persisted every one, or fails naming the first row that could not be sent. A retried task
sends its rows again: the sink is at-least-once.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pulsar
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    DataType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from magnetar.spark_connector._client import open_client
from magnetar.spark_connector._options import SinkOptions
from magnetar.spark_connector._schema import (
    EVENT_TIME,
    KEY,
    MESSAGE_ID,
    PROPERTIES,
    PUBLISH_TIME,
    TOPIC,
    VALUE,
    millis,
)
from magnetar.spark_connector.exceptions import InvalidOptionError, PulsarWriteError
from magnetar.topics import full_topic_name

__all__ = ["PulsarBatchWriter", "PulsarCommitMessage", "PulsarStreamWriter"]

_TEXT_OR_BYTES = (StringType, BinaryType)
_ACCEPTED: dict[str, tuple[type[DataType], ...]] = {
    VALUE: _TEXT_OR_BYTES,
    TOPIC: (StringType,),
    KEY: _TEXT_OR_BYTES,
    EVENT_TIME: (TimestampType, TimestampNTZType, LongType),
    PROPERTIES: (MapType,),
}
_IGNORED = {MESSAGE_ID, PUBLISH_TIME}  # columns of a read, so a read DataFrame writes back
_SEND_TIMEOUT_S = 60.0


@dataclass
class PulsarCommitMessage(WriterCommitMessage):
    """What one task wrote."""

    messages: int
    """Messages persisted by the broker."""


def _check_schema(options: SinkOptions, schema: StructType, overwrite: bool) -> None:
    if overwrite:
        raise InvalidOptionError(
            "Pulsar topics are append-only: write with mode('append'), not 'overwrite'"
        )
    for column in schema.fields:
        if column.name in _IGNORED:
            continue
        accepted = _ACCEPTED.get(column.name)
        if accepted is None:
            raise InvalidOptionError(
                f"column {column.name!r} cannot be written to Pulsar; write {VALUE} and "
                f"optionally {TOPIC}, {KEY}, {EVENT_TIME}, {PROPERTIES} (select or drop the rest)"
            )
        if not isinstance(column.dataType, accepted):
            raise InvalidOptionError(
                f"column {column.name} has type {column.dataType.simpleString()}; accepted: "
                f"{', '.join(t.typeName() for t in accepted)}"
            )
        if isinstance(column.dataType, MapType) and not (
            isinstance(column.dataType.keyType, StringType)
            and isinstance(column.dataType.valueType, StringType)
        ):
            raise InvalidOptionError(f"column {PROPERTIES} must be a map<string,string>")
    if VALUE not in schema.names:
        raise InvalidOptionError(f"a DataFrame written to Pulsar needs a {VALUE!r} column")
    if options.topic is None and TOPIC not in schema.names:
        raise InvalidOptionError(
            f"no topic to write to: set the option topic or give the rows a {TOPIC} column"
        )


def write_rows(options: SinkOptions, rows: Iterator[Row]) -> PulsarCommitMessage:
    """Send ``rows`` and wait until the broker has persisted them all."""
    client = open_client(options.service_url, options.client_conf)
    producers: dict[str, Any] = {}
    done = threading.Condition()
    results: list[Any] = []

    def on_sent(result: Any, _message_id: Any) -> None:
        with done:
            results.append(result)
            done.notify_all()

    sent = 0
    try:
        for row in rows:
            topic = options.topic or _topic(row)
            producer = producers.get(topic)
            if producer is None:
                producer = producers[topic] = _producer(client, topic)
            producer.send_async(_payload(row), on_sent, **_message_conf(row))
            sent += 1
        for producer in producers.values():
            producer.flush()
        with done:
            done.wait_for(lambda: len(results) == sent, timeout=_SEND_TIMEOUT_S)
            failures = [r for r in results if r != pulsar.Result.Ok]
            missing = sent - len(results)
    except pulsar.PulsarException as error:
        raise PulsarWriteError(f"writing to Pulsar failed after {sent} rows: {error}") from None
    finally:
        for producer in producers.values():
            producer.close()
        client.close()
    if failures or missing:
        first = failures[0] if failures else "no reply in time"
        raise PulsarWriteError(
            f"{len(failures) + missing} of {sent} messages were not persisted: {first}"
        )
    return PulsarCommitMessage(sent)


def _producer(client: pulsar.Client, topic: str) -> Any:
    try:
        return client.create_producer(
            topic,
            batching_enabled=True,
            batching_max_publish_delay_ms=10,
            block_if_queue_full=True,
            max_pending_messages=10_000,
        )
    except pulsar.PulsarException as error:
        raise PulsarWriteError(f"cannot create a producer on {topic}: {error}") from None


def _topic(row: Row) -> str:
    name = row[TOPIC]
    if not name:
        raise PulsarWriteError(f"a row has no {TOPIC} and the option topic is not set: {row!r}")
    try:
        return full_topic_name(name)
    except ValueError as error:
        raise PulsarWriteError(f"{TOPIC} of a row: {error}") from None


def _payload(row: Row) -> bytes:
    value = row[VALUE]
    if value is None:
        raise PulsarWriteError(f"a row has a null {VALUE}; Pulsar messages need a payload")
    return value.encode() if isinstance(value, str) else bytes(value)


def _message_conf(row: Row) -> dict[str, Any]:
    fields = row.asDict()
    conf: dict[str, Any] = {}
    key = fields.get(KEY)
    if key is not None:
        conf["partition_key"] = _text(key, KEY)
    event_time = fields.get(EVENT_TIME)
    if event_time is not None:
        conf["event_timestamp"] = _millis(event_time)
    properties = fields.get(PROPERTIES)
    if properties:
        if any(v is None for v in properties.values()):
            raise PulsarWriteError(f"{PROPERTIES} of a row holds a null value: {properties!r}")
        conf["properties"] = dict(properties)
    return conf


def _text(value: str | bytes | bytearray, column: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode()
    except UnicodeDecodeError:
        raise PulsarWriteError(
            f"{column} {bytes(value)!r} is not UTF-8; the Python Pulsar client sends text keys"
        ) from None


def _millis(value: datetime.datetime | int) -> int:
    return value if isinstance(value, int) else millis(value)


class PulsarBatchWriter(DataSourceWriter):
    """``df.write.format("pulsar")``."""

    def __init__(self, options: SinkOptions, schema: StructType, overwrite: bool) -> None:
        _check_schema(options, schema, overwrite)
        self._options = options

    def write(self, iterator: Iterator[Row]) -> PulsarCommitMessage:
        return write_rows(self._options, iterator)


class PulsarStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("pulsar")``."""

    def __init__(self, options: SinkOptions, schema: StructType, overwrite: bool) -> None:
        _check_schema(options, schema, overwrite)
        self._options = options

    def write(self, iterator: Iterator[Row]) -> PulsarCommitMessage:
        return write_rows(self._options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each task's messages are persisted before the task ends."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: Pulsar has no transactions here, hence at-least-once."""
