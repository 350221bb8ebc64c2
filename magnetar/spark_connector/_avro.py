"""Avro record schemas (what Pulsar's JSON and AVRO schemas hold) as Spark types, and back.

The rules are StreamNative's (``SchemaUtils.avro2SqlType`` / ``sqlType2ASchema``), so a topic
gives the same DataFrame columns with this connector as with theirs: a field that is not a
union with null is not nullable; ``[T, null]`` is a nullable T; ``[int, long]`` is a long,
``[float, double]`` a double; other unions are structs of ``member0``, ``member1``, ...;
``date`` is a DateType, ``timestamp-millis``/``-micros`` a TimestampType, ``decimal`` a
DecimalType, enums are strings, maps have string keys.

Decoded values (fastavro's for AVRO, ``json.loads``'s for JSON) are turned into what
``pyarrow.array`` takes for those types by converters built once per schema: most fields need
none, and the rest (JSON times and bytes, complex unions) get one function each.
"""

from __future__ import annotations

import base64
import datetime
import decimal
from collections.abc import Callable
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
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

from magnetar.spark_connector.exceptions import SchemaError

__all__ = ["Converter", "avro_schema", "converter", "inline_named_types", "spark_type"]

Avro = Any
"""A parsed Avro schema: a type name, a dict, or a list (a union)."""

Converter = Callable[[Any], Any]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_EPOCH_DAY = datetime.date(1970, 1, 1)

_PRIMITIVES: dict[str, DataType] = {
    "int": IntegerType(),
    "long": LongType(),
    "string": StringType(),
    "boolean": BooleanType(),
    "bytes": BinaryType(),
    "fixed": BinaryType(),
    "float": FloatType(),
    "double": DoubleType(),
    "enum": StringType(),
}


_NAMED = ("record", "enum", "fixed")
_BUILT_IN = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def inline_named_types(schema: Avro) -> Avro:
    """``schema`` with every reference to a named type (``"com.acme.Address"`` used a second
    time) replaced by its definition, so each part can be read on its own; a record that
    refers to itself raises :class:`SchemaError` (Spark has no recursive types)."""
    return _inline(schema, {}, (), "")


def _inline(schema: Avro, names: dict[str, Avro], stack: tuple[str, ...], namespace: str) -> Avro:
    if isinstance(schema, list):
        return [_inline(branch, names, stack, namespace) for branch in schema]
    if isinstance(schema, str):
        if schema in _BUILT_IN:
            return schema
        full = schema if "." in schema or not namespace else f"{namespace}.{schema}"
        if full in stack or schema in stack:
            raise SchemaError(f"Avro record {full} refers to itself, which Spark cannot hold")
        found = names.get(full, names.get(schema))
        if found is None:
            raise SchemaError(f"Avro type {schema!r} is neither built in nor defined before")
        return found
    if not isinstance(schema, dict):
        raise SchemaError(f"{schema!r} is not an Avro schema")
    kind = schema.get("type")
    if not isinstance(kind, str) or kind not in _NAMED:
        inlined = dict(schema)
        if isinstance(kind, (dict, list)) or (
            isinstance(kind, str) and kind not in _BUILT_IN and kind not in ("array", "map")
        ):
            inlined["type"] = _inline(kind, names, stack, namespace)
        if "items" in schema:
            inlined["items"] = _inline(schema["items"], names, stack, namespace)
        if "values" in schema:
            inlined["values"] = _inline(schema["values"], names, stack, namespace)
        return inlined
    name = str(schema.get("name", ""))
    own_namespace = (
        schema.get("namespace", namespace) if "." not in name else name.rpartition(".")[0]
    )
    full = name if "." in name or not own_namespace else f"{own_namespace}.{name}"
    inlined = dict(schema)
    if kind == "record":
        inner = (*stack, full)
        inlined["fields"] = [
            {**field, "type": _inline(field["type"], names, inner, own_namespace or "")}
            for field in schema.get("fields", [])
        ]
    names[full] = names[name] = inlined
    return inlined


def _kind(schema: Avro) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        kind = schema["type"]
        return _kind(kind) if isinstance(kind, (dict, list)) else str(kind)
    return str(schema)


def _logical(schema: Avro) -> str | None:
    return schema.get("logicalType") if isinstance(schema, dict) else None


def spark_type(schema: Avro, seen: frozenset[str] = frozenset()) -> tuple[DataType, bool]:
    """``(Spark type, nullable)`` of an Avro schema; raises :class:`SchemaError` for what
    Spark cannot hold (recursive records, ``null`` alone)."""
    if isinstance(schema, dict) and isinstance(schema["type"], (dict, list)):
        return spark_type(schema["type"], seen)
    kind = _kind(schema)
    logical = _logical(schema)
    if kind == "int" and logical == "date":
        return DateType(), False
    if kind == "long" and logical in ("timestamp-millis", "timestamp-micros"):
        return TimestampType(), False
    if kind in ("bytes", "fixed") and logical == "decimal":
        return DecimalType(int(schema["precision"]), int(schema.get("scale", 0))), False
    if kind in _PRIMITIVES:
        return _PRIMITIVES[kind], False
    if kind == "record":
        name = _full_name(schema)
        if name in seen:
            raise SchemaError(f"Avro record {name} refers to itself, which Spark cannot hold")
        fields = []
        for field in schema["fields"]:
            data_type, nullable = spark_type(field["type"], seen | {name})
            fields.append(StructField(field["name"], data_type, nullable))
        return StructType(fields), False
    if kind == "array":
        element, contains_null = spark_type(schema["items"], seen)
        return ArrayType(element, contains_null), False
    if kind == "map":
        value, value_null = spark_type(schema["values"], seen)
        return MapType(StringType(), value, value_null), False
    if kind == "union":
        return _union_type(schema, seen)
    raise SchemaError(f"Avro type {schema!r} has no Spark counterpart")


def _union_type(branches: list[Avro], seen: frozenset[str]) -> tuple[DataType, bool]:
    rest = [b for b in branches if _kind(b) != "null"]
    if len(rest) < len(branches):
        if not rest:
            raise SchemaError("an Avro union of null alone has no Spark counterpart")
        data_type, _ = spark_type(rest[0] if len(rest) == 1 else rest, seen)
        return data_type, True
    kinds = {_kind(b) for b in rest}
    if len(rest) == 1:
        return spark_type(rest[0], seen)
    if kinds == {"int", "long"}:
        return LongType(), False
    if kinds == {"float", "double"}:
        return DoubleType(), False
    members = [
        StructField(f"member{i}", spark_type(branch, seen)[0], True)
        for i, branch in enumerate(rest)
    ]
    return StructType(members), False


def _full_name(schema: dict[str, Any]) -> str:
    name = str(schema.get("name", ""))
    namespace = schema.get("namespace")
    return f"{namespace}.{name}" if namespace and "." not in name else name


# --- decoded values -> what pyarrow takes ---------------------------------------------------


def converter(schema: Avro, json_encoded: bool) -> Converter | None:
    """A function making one decoded value of ``schema`` fit its Spark type's Arrow array;
    None when the value fits as it is. ``json_encoded``: the value came from JSON (times as
    numbers, bytes as base64) rather than from fastavro."""
    if isinstance(schema, dict) and isinstance(schema["type"], (dict, list)):
        return converter(schema["type"], json_encoded)
    kind = _kind(schema)
    logical = _logical(schema)
    if kind == "record":
        return _record_converter(schema, json_encoded)
    if kind == "array":
        item = converter(schema["items"], json_encoded)
        return None if item is None else lambda v: None if v is None else [item(x) for x in v]
    if kind == "map":
        value = converter(schema["values"], json_encoded)
        if value is None:
            return None
        return lambda v: None if v is None else {k: value(x) for k, x in v.items()}
    if kind == "union":
        return _union_converter(schema, json_encoded)
    if not json_encoded:
        return None  # fastavro already gives datetime, date, Decimal, bytes
    if kind == "long" and logical == "timestamp-millis":
        return lambda v: None if v is None else _EPOCH + datetime.timedelta(milliseconds=v)
    if kind == "long" and logical == "timestamp-micros":
        return lambda v: None if v is None else _EPOCH + datetime.timedelta(microseconds=v)
    if kind == "int" and logical == "date":
        return lambda v: None if v is None else _EPOCH_DAY + datetime.timedelta(days=v)
    if kind in ("bytes", "fixed") and logical == "decimal":
        return lambda v: None if v is None else decimal.Decimal(str(v))
    if kind in ("bytes", "fixed"):
        return lambda v: v if v is None or isinstance(v, bytes) else base64.b64decode(v)
    return None


def _record_converter(schema: dict[str, Any], json_encoded: bool) -> Converter | None:
    fields = [(f["name"], converter(f["type"], json_encoded)) for f in schema["fields"]]
    active = [(name, convert) for name, convert in fields if convert is not None]
    if not active:
        return None

    def convert_record(value: Any) -> Any:
        if value is None:
            return None
        record = dict(value)
        for name, convert in active:
            if name in record:
                record[name] = convert(record[name])
        return record

    return convert_record


def _union_converter(branches: list[Avro], json_encoded: bool) -> Converter | None:
    rest = [b for b in branches if _kind(b) != "null"]
    kinds = {_kind(b) for b in rest}
    if len(rest) == 1:
        return converter(rest[0], json_encoded)
    if kinds in ({"int", "long"}, {"float", "double"}):
        return None
    members = [(i, _kind(branch), converter(branch, json_encoded)) for i, branch in enumerate(rest)]

    def convert_member(value: Any) -> Any:
        if value is None:
            return None
        for index, kind, convert in members:
            if _fits(value, kind):
                return {f"member{index}": convert(value) if convert else value}
        raise SchemaError(f"value {value!r} matches no branch of the union {branches!r}")

    return convert_member


_PYTHON_KINDS: dict[str, tuple[type, ...]] = {
    "boolean": (bool,),
    "int": (int,),
    "long": (int,),
    "float": (float, int),
    "double": (float, int),
    "string": (str,),
    "enum": (str,),
    "bytes": (bytes, str),
    "fixed": (bytes, str),
    "record": (dict,),
    "map": (dict,),
    "array": (list,),
}


def _fits(value: Any, kind: str) -> bool:
    if isinstance(value, bool) and kind != "boolean":
        return False
    return isinstance(value, _PYTHON_KINDS.get(kind, ()))


# --- Spark types -> Avro, for writing -------------------------------------------------------


def avro_schema(
    data_type: DataType,
    nullable: bool = False,
    record_name: str = "topLevelRecord",
    namespace: str = "",
) -> Avro:
    """The Avro schema StreamNative's writer derives from a Spark type (a DataFrame's value
    columns as the record ``topLevelRecord``); nullable types are ``[T, "null"]``."""
    schema: Avro
    if isinstance(data_type, BooleanType):
        schema = "boolean"
    elif isinstance(data_type, (ByteType, ShortType, IntegerType)):
        schema = "int"
    elif isinstance(data_type, LongType):
        schema = "long"
    elif isinstance(data_type, DateType):
        schema = {"type": "int", "logicalType": "date"}
    elif isinstance(data_type, (TimestampType, TimestampNTZType)):
        schema = {"type": "long", "logicalType": "timestamp-micros"}
    elif isinstance(data_type, FloatType):
        schema = "float"
    elif isinstance(data_type, DoubleType):
        schema = "double"
    elif isinstance(data_type, StringType):
        schema = "string"
    elif isinstance(data_type, BinaryType):
        schema = "bytes"
    elif isinstance(data_type, DecimalType):
        schema = {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": data_type.precision,
            "scale": data_type.scale,
        }
    elif isinstance(data_type, ArrayType):
        items = avro_schema(data_type.elementType, data_type.containsNull, record_name, namespace)
        schema = {"type": "array", "items": items}
    elif isinstance(data_type, MapType) and isinstance(data_type.keyType, StringType):
        values = avro_schema(
            data_type.valueType, data_type.valueContainsNull, record_name, namespace
        )
        schema = {"type": "map", "values": values}
    elif isinstance(data_type, StructType):
        child_namespace = f"{namespace}.{record_name}" if namespace else record_name
        fields = [
            {
                "name": field.name,
                "type": avro_schema(field.dataType, field.nullable, field.name, child_namespace),
            }
            for field in data_type.fields
        ]
        schema = {"type": "record", "name": record_name, "namespace": namespace, "fields": fields}
    else:
        raise SchemaError(
            f"a column of type {data_type.simpleString()} cannot be written to Pulsar"
        )
    return [schema, "null"] if nullable else schema
