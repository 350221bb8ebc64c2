"""A topic's Pulsar schema, and the value columns it gives a DataFrame (as StreamNative).

A topic without a schema, or with BYTES, gives one binary ``value`` column; a primitive
schema gives ``value`` of its Spark type (STRING a string, INT32 an integer, DATE a date,
...); a JSON or AVRO schema, an Avro record, gives one column per field, flattened: the
record's fields are the DataFrame's first columns, nested records are structs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from magnetar.spark_connector._avro import inline_named_types, spark_type
from magnetar.spark_connector.exceptions import SchemaError

__all__ = ["NO_SCHEMA", "PRIMITIVE_TYPES", "RECORD_TYPES", "TopicSchema"]

PRIMITIVE_TYPES: dict[str, DataType] = {
    "NONE": BinaryType(),
    "BYTES": BinaryType(),
    "STRING": StringType(),
    "BOOLEAN": BooleanType(),
    "INT8": ByteType(),
    "INT16": ShortType(),
    "INT32": IntegerType(),
    "INT64": LongType(),
    "FLOAT": FloatType(),
    "DOUBLE": DoubleType(),
    "DATE": DateType(),
    "TIMESTAMP": TimestampType(),
}
"""Pulsar's primitive schema types and the Spark type of their ``value`` column."""

RECORD_TYPES = ("JSON", "AVRO")
_ALIASES = {"BOOL": "BOOLEAN"}


@dataclass(frozen=True)
class TopicSchema:
    """A Pulsar schema: its type and, for JSON and AVRO, the Avro record definition."""

    type: str
    """Pulsar's ``SchemaType`` name: NONE, BYTES, STRING, INT32, ..., JSON, AVRO."""
    definition: str = ""
    """For JSON and AVRO: the Avro schema as JSON text, normalised (keys sorted)."""

    @classmethod
    def of(cls, schema_type: str, definition: str | None = None, where: str = "") -> TopicSchema:
        """A checked schema; ``where`` says where it came from, for error messages."""
        name = schema_type.strip().upper()
        name = _ALIASES.get(name, name)
        origin = f" ({where})" if where else ""
        if name in RECORD_TYPES:
            if not definition or not definition.strip():
                raise SchemaError(f"a {name} schema needs its Avro record definition{origin}")
            try:
                parsed = json.loads(definition)
            except json.JSONDecodeError as error:
                raise SchemaError(
                    f"the {name} schema definition is not JSON{origin}: {error.msg} at "
                    f"position {error.pos}"
                ) from None
            if not isinstance(parsed, (dict, list, str)):
                raise SchemaError(f"the {name} schema definition is not an Avro schema{origin}")
            schema = cls(name, json.dumps(parsed, sort_keys=True))
            schema.value_fields()  # fails now on what Spark cannot hold
            return schema
        if name == "TIME":
            raise SchemaError(f"Pulsar's TIME schema has no Spark counterpart{origin}")
        if name not in PRIMITIVE_TYPES:
            known = ", ".join([*PRIMITIVE_TYPES, *RECORD_TYPES])
            raise SchemaError(f"schema type {schema_type!r} is not supported{origin}: use {known}")
        return cls(name)

    @property
    def is_raw(self) -> bool:
        """Payloads as they are: no schema, or BYTES."""
        return self.type in ("NONE", "BYTES")

    @property
    def is_record(self) -> bool:
        return self.type in RECORD_TYPES

    @cached_property
    def avro(self) -> Any:
        """The parsed Avro definition (JSON and AVRO only), named types used again inlined."""
        return inline_named_types(json.loads(self.definition))

    @cached_property
    def flattened(self) -> bool:
        """Whether the value is an Avro record whose fields become the columns."""
        return self.is_record and isinstance(self.avro, dict) and self.avro.get("type") == "record"

    def value_fields(self) -> list[StructField]:
        """The DataFrame columns holding the value, before the metadata columns."""
        if not self.is_record:
            return [StructField("value", PRIMITIVE_TYPES[self.type], nullable=False)]
        data_type, nullable = spark_type(self.avro)
        if self.flattened:
            assert isinstance(data_type, StructType)
            return list(data_type.fields)
        return [StructField("value", data_type, nullable)]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "definition": self.definition}

    def describe(self) -> str:
        return f"{self.type} {self.definition}" if self.definition else self.type


NO_SCHEMA = TopicSchema("NONE")
"""A topic without a schema: payloads are bytes."""
