"""The columns of a Pulsar DataFrame, and messages turned into Arrow record batches.

Executors hand Spark Arrow batches rather than tuples: building columns is several times
cheaper than Spark converting one Python tuple per message.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator
from typing import Any

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

__all__ = [
    "EVENT_TIME",
    "KEY",
    "MESSAGE_ID",
    "PROPERTIES",
    "PUBLISH_TIME",
    "SCHEMA",
    "TOPIC",
    "VALUE",
    "millis",
    "record_batches",
]

VALUE = "value"
KEY = "__key"
TOPIC = "__topic"
MESSAGE_ID = "__messageId"
PUBLISH_TIME = "__publishTime"
EVENT_TIME = "__eventTime"
PROPERTIES = "__messageProperties"

SCHEMA = StructType(
    [
        StructField(VALUE, BinaryType()),
        StructField(KEY, BinaryType()),
        StructField(TOPIC, StringType()),
        StructField(MESSAGE_ID, BinaryType()),
        StructField(PUBLISH_TIME, TimestampType()),
        StructField(EVENT_TIME, TimestampType()),
        StructField(PROPERTIES, MapType(StringType(), StringType())),
    ]
)
"""``value`` holds the payload bytes (there is no schema registry to decode them with)."""

_TIMESTAMP = pa.timestamp("us", tz="UTC")
_MILLIS = pa.timestamp("ms", tz="UTC")
_ARROW_SCHEMA = pa.schema(
    [
        pa.field(VALUE, pa.binary()),
        pa.field(KEY, pa.binary()),
        pa.field(TOPIC, pa.string()),
        pa.field(MESSAGE_ID, pa.binary()),
        pa.field(PUBLISH_TIME, _TIMESTAMP),
        pa.field(EVENT_TIME, _TIMESTAMP),
        pa.field(PROPERTIES, pa.map_(pa.string(), pa.string())),
    ]
)

BATCH_ROWS = 8192


def record_batches(
    messages: Iterable[tuple[Any, Any]], topic: str, batch_rows: int = BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """``(message, message_id)`` pairs of ``topic`` as record batches of at most
    ``batch_rows`` rows."""
    columns: list[list[Any]] = [[] for _ in range(6)]
    # Bound methods: this loop runs once per message.
    add_value, add_key, add_id, add_published, add_event, add_properties = (
        column.append for column in columns
    )
    count = 0
    for message, message_id in messages:
        add_value(message.data())
        add_key(message.partition_key())
        add_id(message_id.serialize())
        add_published(message.publish_timestamp())
        add_event(message.event_timestamp())
        add_properties(message.properties())
        count += 1
        if count == batch_rows:
            yield _batch(columns, topic)
            for column in columns:
                column.clear()
            count = 0
    if count:
        yield _batch(columns, topic)


def _batch(columns: list[list[Any]], topic: str) -> pa.RecordBatch:
    """Whole-column conversions, cheaper than per-message Python."""
    values, keys, ids, published, events, properties = columns
    key_text = pa.array(keys, pa.string())
    event_ms = pa.array(events, pa.int64())
    return pa.RecordBatch.from_arrays(
        [
            pa.array(values, pa.binary()),
            pc.if_else(pc.equal(key_text, ""), None, key_text).cast(pa.binary()),  # "" = no key
            pa.repeat(pa.scalar(topic, pa.string()), len(values)),
            pa.array(ids, pa.binary()),
            pa.array(published, _MILLIS).cast(_TIMESTAMP),
            pc.if_else(pc.equal(event_ms, 0), None, event_ms).cast(_MILLIS).cast(_TIMESTAMP),
            pa.array(properties, _ARROW_SCHEMA.field(PROPERTIES).type),  # 0 = no event time
        ],
        schema=_ARROW_SCHEMA,
    )


def millis(value: datetime.datetime) -> int:
    """Milliseconds since the epoch of a timestamp from a Spark row (a naive local time, which
    ``timestamp()`` reads as such), without float rounding."""
    whole_seconds = int(value.replace(microsecond=0).timestamp())
    return whole_seconds * 1000 + value.microsecond // 1000
