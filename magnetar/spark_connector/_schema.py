"""The columns of a Pulsar DataFrame, and messages turned into Arrow record batches.

The value columns come first (see :mod:`._topic_schema`: ``value`` of bytes for a topic
without a schema), then the metadata columns, as StreamNative's connector has them.
Executors hand Spark Arrow batches rather than tuples: building columns is several times
cheaper than Spark converting one Python tuple per message.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BinaryType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from magnetar.spark_connector._ranges import Chunk
from magnetar.spark_connector._topic_schema import NO_SCHEMA, TopicSchema
from magnetar.spark_connector._values import ValueDecoder
from magnetar.spark_connector.exceptions import SchemaError

__all__ = [
    "EVENT_TIME",
    "KEY",
    "MESSAGE_ID",
    "META_FIELDS",
    "PROPERTIES",
    "PUBLISH_TIME",
    "SCHEMA",
    "TOPIC",
    "VALUE",
    "arrow_schema",
    "describe_id",
    "millis",
    "record_batches",
    "source_schema",
]

VALUE = "value"
KEY = "__key"
TOPIC = "__topic"
MESSAGE_ID = "__messageId"
PUBLISH_TIME = "__publishTime"
EVENT_TIME = "__eventTime"
PROPERTIES = "__messageProperties"

META_FIELDS = [
    StructField(KEY, BinaryType()),
    StructField(TOPIC, StringType()),
    StructField(MESSAGE_ID, BinaryType()),
    StructField(PUBLISH_TIME, TimestampType()),
    StructField(EVENT_TIME, TimestampType()),
    StructField(PROPERTIES, MapType(StringType(), StringType())),
]
"""The metadata columns, after the value columns."""


def source_schema(schema: TopicSchema) -> StructType:
    """The DataFrame schema of topics with ``schema``."""
    values = schema.value_fields()
    clash = {f.name for f in values} & {f.name for f in META_FIELDS}
    if clash:
        raise SchemaError(
            f"the topic's {schema.type} schema has fields named like metadata columns "
            f"({', '.join(sorted(clash))}); read it with allowDifferentTopicSchemas=true"
        )
    return StructType(values + META_FIELDS)


SCHEMA = source_schema(NO_SCHEMA)
"""The columns of a topic without a schema: ``value`` holds the payload bytes."""

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_MILLIS = pa.timestamp("ms", tz="UTC")
_PROPERTIES_TYPE = pa.map_(pa.string(), pa.string())
_META_ARROW = [
    pa.field(KEY, pa.binary()),
    pa.field(TOPIC, pa.string()),
    pa.field(MESSAGE_ID, pa.binary()),
    pa.field(PUBLISH_TIME, _TIMESTAMP),
    pa.field(EVENT_TIME, _TIMESTAMP),
    pa.field(PROPERTIES, _PROPERTIES_TYPE),
]


def arrow_schema(decoder: ValueDecoder) -> pa.Schema:
    """The Arrow schema of the record batches of values decoded by ``decoder``."""
    return pa.schema(decoder.arrow_fields + _META_ARROW)


def record_batches(
    chunks: Iterable[Chunk], topic: str, decoder: ValueDecoder
) -> Iterator[pa.RecordBatch]:
    """Chunks of messages of ``topic`` as record batches, values decoded by ``decoder``."""
    schema = arrow_schema(decoder)
    for chunk in chunks:
        yield pa.RecordBatch.from_arrays(_columns(chunk, topic, decoder), schema=schema)


def _columns(chunk: Chunk, topic: str, decoder: ValueDecoder) -> list[pa.Array]:
    """Each column is one method of the client's classes mapped over the chunk, the cheapest
    per-message loop there is; the rest is done by Arrow on whole columns."""
    messages, ids = chunk
    rows = len(messages)
    message = type(messages[0])

    def describe(index: int) -> str:
        return f"message {describe_id(ids[index])} of {topic}"

    keys = pa.array(map(message.partition_key, messages), pa.string(), size=rows)
    events = pa.array(map(message.event_timestamp, messages), pa.int64(), size=rows)
    return [
        *decoder.decode(pa.array(map(message.data, messages), pa.binary(), size=rows), describe),
        _null_where(keys.cast(pa.binary()), pc.equal(keys, "")),  # "": no key
        pa.repeat(pa.scalar(topic, pa.string()), rows),
        pa.array(ids, pa.binary()),
        _timestamps(pa.array(map(message.publish_timestamp, messages), pa.int64(), size=rows)),
        _timestamps(_null_where(events, pc.equal(events, 0))),  # 0: no time
        _properties(list(map(message.properties, messages))),
    ]


def _null_where(values: pa.Array, mask: pa.Array) -> pa.Array:
    return pc.if_else(mask, pa.scalar(None, values.type), values)


def _timestamps(millis: pa.Array) -> pa.Array:
    return millis.cast(_MILLIS).cast(_TIMESTAMP)


def _properties(properties: list[dict[str, str]]) -> pa.Array:
    if any(properties):
        return pa.array(properties, _PROPERTIES_TYPE)
    # No message has properties (the common case): offsets only, no per-row conversion.
    offsets = pa.array([0] * (len(properties) + 1), pa.int32())
    return pa.MapArray.from_arrays(offsets, pa.array([], pa.string()), pa.array([], pa.string()))


def describe_id(serialized: bytes) -> str:
    """A serialized message id as ``(ledger, entry, batch index)``, for error messages."""
    import pulsar

    message_id = pulsar.MessageId.deserialize(serialized)
    return f"({message_id.ledger_id()}, {message_id.entry_id()}, {message_id.batch_index()})"


def millis(value: datetime.datetime) -> int:
    """Milliseconds since the epoch of a timestamp from a Spark row (a naive local time, which
    ``timestamp()`` reads as such), without float rounding."""
    whole_seconds = int(value.replace(microsecond=0).timestamp())
    return whole_seconds * 1000 + value.microsecond // 1000
