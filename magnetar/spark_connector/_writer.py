"""Writing rows to Pulsar, in batch and streaming queries.

Each Spark task sends its rows asynchronously (batched) and returns once the broker has
persisted every one, or fails naming the first row that could not be sent. A retried task
sends its rows again: the sink is at-least-once. Values are encoded as
:mod:`._sink_schema` says; the schema of a topic named by the ``topic`` option is settled
when the query is planned, that of each row's ``__topic`` by the task that first writes there.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pulsar
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from magnetar.spark_connector._admin import AdminClient
from magnetar.spark_connector._client import shared_client
from magnetar.spark_connector._options import SinkOptions
from magnetar.spark_connector._passthrough import producer_kwargs
from magnetar.spark_connector._schema import (
    EVENT_TIME,
    KEY,
    MESSAGE_ID,
    PROPERTIES,
    PUBLISH_TIME,
    TOPIC,
    millis,
)
from magnetar.spark_connector._schema_lookup import (
    SchemaSource,
    broker_has_registry,
    record_schema,
)
from magnetar.spark_connector._sink_schema import ValueColumns, announced_schema, derived_schema
from magnetar.spark_connector._topic_schema import TopicSchema
from magnetar.spark_connector.exceptions import InvalidOptionError, PulsarWriteError, SchemaError
from magnetar.topics import full_topic_name

__all__ = ["PulsarBatchWriter", "PulsarCommitMessage", "PulsarStreamWriter"]

log = logging.getLogger(__name__)

_SEND_TIMEOUT_S = 60.0
_PRODUCER_DEFAULTS: dict[str, Any] = {
    "batching_enabled": True,
    "batching_max_publish_delay_ms": 10,
    "block_if_queue_full": True,
    "max_pending_messages": 10_000,
}


@dataclass
class PulsarCommitMessage(WriterCommitMessage):
    """What one task wrote."""

    messages: int
    """Messages persisted by the broker."""


def _check_columns(options: SinkOptions, schema: StructType, overwrite: bool) -> ValueColumns:
    """StreamNative's checks of the metadata columns, then the value columns."""
    if overwrite:
        raise InvalidOptionError(
            "Pulsar topics are append-only: write with mode('append'). (Spark lets Python "
            "data sources take only the save modes append and overwrite, so the default "
            "errorifexists that StreamNative's connector accepts is not possible either.)"
        )
    fields = {f.name: f.dataType for f in schema.fields}
    if TOPIC not in fields and options.topic is None:
        raise InvalidOptionError(
            f"topic option required when no '{TOPIC}' attribute is present. Use the topic "
            "option for setting a topic."
        )
    checks: list[tuple[str, tuple[type, ...], str]] = [
        (TOPIC, (StringType,), "Topic type must be a string"),
        (KEY, (StringType, BinaryType), f"{KEY} attribute type must be a string or binary"),
        (
            EVENT_TIME,
            (LongType, TimestampType, TimestampNTZType),
            f"{EVENT_TIME} attribute type must be a bigint or timestamp",
        ),
        (PROPERTIES, (MapType,), f"{PROPERTIES} attribute type must be a map<string,string>"),
    ]
    for name, accepted, message in checks:
        data_type = fields.get(name)
        if data_type is not None and not isinstance(data_type, accepted):
            raise InvalidOptionError(f"{message}, not {data_type.simpleString()}")
    properties = fields.get(PROPERTIES)
    if isinstance(properties, MapType) and not (
        isinstance(properties.keyType, StringType) and isinstance(properties.valueType, StringType)
    ):
        raise InvalidOptionError(f"{PROPERTIES} attribute type must be a map<string,string>")
    for name in (MESSAGE_ID, PUBLISH_TIME):
        if name in fields:
            log.info("column %s is set by the broker; it is not written", name)
    return ValueColumns.of(schema)


class _Encoders:
    """Per topic: how a row's value is encoded, and the producer schema that goes with it."""

    def __init__(self, options: SinkOptions, columns: ValueColumns) -> None:
        self._options = options
        self._columns = columns
        self._known: dict[str, tuple[Callable[[Row], bytes], Any]] = {}

    def settle(self, client: pulsar.Client, topic: str) -> TopicSchema:
        """The schema values are written to ``topic`` with: the option's, else the topic's,
        else one derived from the columns, which is recorded where the broker keeps none;
        :class:`SchemaError` if the columns cannot fit it."""
        options = self._options
        admin = AdminClient(options.admin_url, options.admin_conf) if options.admin_url else None
        existing = SchemaSource(client, options.service_url, admin).schema_of(topic)
        derived = existing if not existing.is_raw else derived_schema(self._columns)
        schema = options.schema or derived
        self._columns.encoder_for(schema, topic)  # fails now if the columns do not fit
        if existing.is_raw and not schema.is_raw and not broker_has_registry(options.service_url):
            record_schema(client, topic, schema)
        return schema

    def encode_for(self, client: pulsar.Client, topic: str) -> tuple[Callable[[Row], bytes], Any]:
        found = self._known.get(topic)
        if found is None:
            schema = self.settle(client, topic)
            found = self._known[topic] = (
                self._columns.encoder_for(schema, topic),
                announced_schema(schema),
            )
        return found

    def preset(self, topic: str, schema: TopicSchema) -> None:
        self._known[topic] = (self._columns.encoder_for(schema, topic), announced_schema(schema))


@dataclass(frozen=True)
class _Plan:
    """What every task of one write gets."""

    options: SinkOptions
    columns: ValueColumns
    topic_schema: TopicSchema | None
    """The schema of the ``topic`` option's topic, settled on the driver."""


def _plan(options: SinkOptions, schema: StructType, overwrite: bool) -> _Plan:
    columns = _check_columns(options, schema, overwrite)
    topic_schema = None
    if options.topic is not None:
        client = shared_client(options.service_url, options.client_conf)
        topic_schema = _Encoders(options, columns).settle(client, options.topic)
    return _Plan(options, columns, topic_schema)


def write_rows(plan: _Plan, rows: Iterator[Row]) -> PulsarCommitMessage:
    """Send ``rows`` and wait until the broker has persisted them all."""
    options = plan.options
    client = shared_client(options.service_url, options.client_conf)
    encoders = _Encoders(options, plan.columns)
    if options.topic is not None and plan.topic_schema is not None:
        encoders.preset(options.topic, plan.topic_schema)
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
            encode, announced = encoders.encode_for(client, topic)
            producer = producers.get(topic)
            if producer is None:
                producer = producers[topic] = _producer(client, topic, options, announced)
            try:
                payload = encode(row)
            except SchemaError as error:
                raise PulsarWriteError(f"row {sent + 1} of this task to {topic}: {error}") from None
            producer.send_async(payload, on_sent, **_message_conf(row))
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
    if failures or missing:
        first = failures[0] if failures else "no reply in time"
        raise PulsarWriteError(
            f"{len(failures) + missing} of {sent} messages were not persisted: {first}"
        )
    return PulsarCommitMessage(sent)


def _producer(client: pulsar.Client, topic: str, options: SinkOptions, schema: Any) -> Any:
    kwargs = {**_PRODUCER_DEFAULTS, **producer_kwargs(options.producer_conf)}
    if schema is not None:
        kwargs["schema"] = schema
    initial = options.producer_conf.get("initialSubscriptionName")
    try:
        if initial:
            # Java creates it with the topic; creating it if absent keeps what it is for.
            client.subscribe(
                topic, initial, initial_position=pulsar.InitialPosition.Earliest
            ).close()
        return client.create_producer(topic, **kwargs)
    except pulsar.IncompatibleSchema as error:
        raise PulsarWriteError(
            f"Cannot write incompatible data to topic {topic}. Details: {error}"
        ) from None
    except pulsar.PulsarException as error:
        raise PulsarWriteError(f"cannot create a producer on {topic}: {error}") from None


def _topic(row: Row) -> str:
    name = row[TOPIC]
    if not name:
        raise PulsarWriteError(
            f"null topic present in the data. Use the topic option for setting a topic: {row!r}"
        )
    try:
        return full_topic_name(name)
    except ValueError as error:
        raise PulsarWriteError(f"{TOPIC} of a row: {error}") from None


def _message_conf(row: Row) -> dict[str, Any]:
    fields = row.asDict()
    conf: dict[str, Any] = {}
    key = fields.get(KEY)
    if key is not None:
        conf["partition_key"] = _text(key, KEY)
    event_time = fields.get(EVENT_TIME)
    if event_time is not None:
        event_ms = _millis(event_time)
        if event_ms > 0:  # as StreamNative: 0 and below mean none
            conf["event_timestamp"] = event_ms
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
        self._plan = _plan(options, schema, overwrite)

    def write(self, iterator: Iterator[Row]) -> PulsarCommitMessage:
        return write_rows(self._plan, iterator)


class PulsarStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("pulsar")``."""

    def __init__(self, options: SinkOptions, schema: StructType, overwrite: bool) -> None:
        self._plan = _plan(options, schema, overwrite)

    def write(self, iterator: Iterator[Row]) -> PulsarCommitMessage:
        return write_rows(self._plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each task's messages are persisted before the task ends."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: Pulsar has no transactions here, hence at-least-once."""
