"""How a DataFrame's rows become message values: which columns, which schema, which bytes.

As StreamNative's writer: ``__topic``, ``__key``, ``__eventTime`` and
``__messageProperties`` are message metadata, ``__messageId`` and ``__publishTime`` (columns
of a read) are ignored, every other column is the value. The value is encoded by the topic's
schema when it has one (or by ``schema.type`` / ``schema.definition``); a topic without one
gets StreamNative's: a single column by its type (a string column is STRING, a long INT64,
...), several columns or one struct as an AVRO record ``topLevelRecord``. Where the broker
keeps no schemas (pulsar-lite) that schema is recorded for readers (see
:mod:`._schema_lookup`).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from magnetar.spark_connector._avro import avro_schema, spark_type
from magnetar.spark_connector._schema import (
    EVENT_TIME,
    KEY,
    MESSAGE_ID,
    PROPERTIES,
    PUBLISH_TIME,
    TOPIC,
)
from magnetar.spark_connector._topic_schema import TopicSchema
from magnetar.spark_connector._values import encoder
from magnetar.spark_connector.exceptions import InvalidOptionError, SchemaError

__all__ = ["META_COLUMNS", "ValueColumns", "announced_schema", "derived_schema"]

META_COLUMNS = {TOPIC, KEY, EVENT_TIME, PROPERTIES, MESSAGE_ID, PUBLISH_TIME}

_DERIVED: list[tuple[type[DataType], str]] = [
    (StringType, "STRING"),
    (BinaryType, "BYTES"),
    (BooleanType, "BOOLEAN"),
    (ByteType, "INT8"),
    (ShortType, "INT16"),
    (IntegerType, "INT32"),
    (LongType, "INT64"),
    (FloatType, "FLOAT"),
    (DoubleType, "DOUBLE"),
    (DateType, "DATE"),
    (TimestampType, "TIMESTAMP"),
]


@dataclass(frozen=True)
class ValueColumns:
    """The value columns of a DataFrame written to Pulsar."""

    fields: tuple[StructField, ...]

    @classmethod
    def of(cls, schema: StructType) -> ValueColumns:
        fields = tuple(f for f in schema.fields if f.name not in META_COLUMNS)
        if not fields:
            raise InvalidOptionError(
                "Schema should have at least one non-key/non-topic field: the DataFrame has "
                f"only metadata columns ({', '.join(schema.names)}); add a value column"
            )
        return cls(fields)

    @property
    def record(self) -> bool:
        """Whether the value is a record: several columns, or one struct."""
        return len(self.fields) > 1 or isinstance(self.fields[0].dataType, StructType)

    @property
    def record_type(self) -> StructType:
        if len(self.fields) == 1 and isinstance(self.fields[0].dataType, StructType):
            return self.fields[0].dataType
        return StructType(list(self.fields))

    def describe(self) -> str:
        return ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in self.fields)

    def encoder_for(self, schema: TopicSchema, topic: str) -> Callable[[Row], bytes]:
        """Turns a row into the bytes of its value in ``schema``; :class:`SchemaError` now
        if the columns cannot fit the schema at all."""
        encode = encoder(schema)
        if not schema.is_record or not schema.flattened:
            if self.record:
                raise SchemaError(
                    f"{topic} has a {schema.type} schema, which holds one value, but the "
                    f"DataFrame's value columns are a record ({self.describe()}); write one "
                    "value column, or to a topic with a JSON or AVRO schema"
                )
            name = self.fields[0].name
            convert = _python(self.fields[0].dataType)
            return lambda row: encode(convert(row[name]))
        self._check_fits(schema, topic)
        convert_record = _python(self.record_type)
        if len(self.fields) == 1 and isinstance(self.fields[0].dataType, StructType):
            name = self.fields[0].name
            return lambda row: encode(convert_record(row[name]))
        return lambda row: encode(convert_record(row))  # the value columns, by name

    def _check_fits(self, schema: TopicSchema, topic: str) -> None:
        record, _ = spark_type(schema.avro)
        assert isinstance(record, StructType)
        fields = {f.name: f for f in record.fields}
        extra = [f.name for f in self.record_type.fields if f.name not in fields]
        if extra:
            raise SchemaError(
                f"{topic} has a {schema.type} schema without the field(s) "
                f"{', '.join(extra)}; its fields: {', '.join(fields)}"
            )
        given = set(self.record_type.names)
        missing = [
            name
            for name, f in fields.items()
            if name not in given and not f.nullable and not _has_default(schema.avro, name)
        ]
        if missing:
            raise SchemaError(
                f"{topic} has a {schema.type} schema that requires the field(s) "
                f"{', '.join(missing)}, which the DataFrame lacks"
            )


def _has_default(avro: dict[str, Any], name: str) -> bool:
    return any(f["name"] == name and "default" in f for f in avro.get("fields", []))


def derived_schema(columns: ValueColumns) -> TopicSchema:
    """The schema StreamNative's writer gives a topic without one, from the value columns."""
    if columns.record:
        definition = avro_schema(columns.record_type)
        return TopicSchema.of("AVRO", json.dumps(definition))
    data_type = columns.fields[0].dataType
    for spark_class, name in _DERIVED:
        if isinstance(data_type, spark_class):
            return TopicSchema.of(name)
    raise SchemaError(
        f"a value column of type {data_type.simpleString()} cannot be written to Pulsar: "
        f"use one of {', '.join(t().simpleString() for t, _ in _DERIVED)}, or a struct"
    )


def _python(data_type: DataType) -> Callable[[Any], Any]:
    """Converts a Spark row value to what the encoders take: records as dicts, timestamps
    aware (Spark hands them over as naive local times), binary as bytes."""
    if isinstance(data_type, StructType):
        fields = [(f.name, _python(f.dataType)) for f in data_type.fields]
        return lambda v: None if v is None else {n: c(v[n]) for n, c in fields}
    if isinstance(data_type, ArrayType):
        item = _python(data_type.elementType)
        return lambda v: None if v is None else [item(x) for x in v]
    if isinstance(data_type, MapType):
        value = _python(data_type.valueType)
        return lambda v: None if v is None else {k: value(x) for k, x in v.items()}
    if isinstance(data_type, (TimestampType, TimestampNTZType)):
        return _aware
    if isinstance(data_type, BinaryType):
        return lambda v: None if v is None else bytes(v)
    return _same


def _same(value: Any) -> Any:
    return value


def _aware(value: datetime.datetime | None) -> datetime.datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.astimezone()


def announced_schema(schema: TopicSchema) -> Any:
    """The ``pulsar.schema.Schema`` a producer announces to the broker (which registers it
    or checks it against the topic's), carrying values this module already encoded; None
    for raw bytes, or a type the Python client cannot announce (BOOLEAN, DATE, TIMESTAMP)."""
    import _pulsar
    from pulsar.schema import Schema

    kind = getattr(_pulsar.SchemaType, schema.type, None)
    if schema.is_raw or kind is None:
        return None

    class _Encoded(Schema):  # type: ignore[misc]
        def __init__(self) -> None:
            definition = schema.avro if schema.is_record else None
            super().__init__(bytes, kind, definition, schema.type)

        def encode(self, obj: bytes) -> bytes:
            return obj

        def decode(self, data: bytes) -> bytes:
            return data

    return _Encoded()
