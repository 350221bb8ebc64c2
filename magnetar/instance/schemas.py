"""Schemas for Python functions: inputs decoded into, and outputs encoded from, the values a
pulsar-client schema gives (STRING: str, BYTES: bytes, JSON and AVRO: ``pulsar.schema.Record``
instances), where Apache Pulsar's Python runtime has only SerDes.

The record class of a JSON or AVRO input is ``inputTypeClassName`` or the annotation of
``process``'s input; that of the output is ``outputTypeClassName`` or ``process``'s return
annotation. The output topic gets the schema registered (its producer declares it), so
readers of the topic (Spark, other functions, pulsar-client consumers) can type it.
"""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Any

from pulsar.schema import AvroSchema, BytesSchema, JsonSchema, Record, Schema, StringSchema

from magnetar.instance.config import FunctionConfig
from magnetar.instance.exceptions import FunctionLoadError, SerDeError
from magnetar.instance.loader import LoadedFunction, load_attribute
from magnetar.instance.serde import SerDe

__all__ = ["PASSED_THROUGH", "SchemaSerDe", "input_schema_serdes", "output_schema_serde"]


class SchemaSerDe:
    """A SerDe that encodes and decodes with a pulsar-client schema; a value that does not fit
    is a ``SerDeError`` naming the schema."""

    def __init__(self, schema: Schema, kind: str) -> None:
        self.schema = schema
        self._kind = kind

    def serialize(self, input: Any) -> bytes:
        try:
            return bytes(self.schema.encode(input))
        except Exception as error:
            raise SerDeError(
                f"the result does not fit the output's {self._kind} schema: "
                f"{type(error).__name__}: {error}"
            ) from None

    def deserialize(self, input_bytes: bytes) -> Any:
        try:
            return self.schema.decode(input_bytes)
        except Exception as error:
            raise SerDeError(
                f"the message does not fit the {self._kind} schema: {type(error).__name__}: {error}"
            ) from None

    def producer_schema(self) -> Schema:
        """The schema an output producer declares: the broker registers it on the topic,
        while the payloads this SerDe encoded already go out as they are."""
        return _Encoded(self.schema)


class _Encoded(Schema):  # type: ignore[misc]
    def __init__(self, schema: Schema) -> None:
        # Not Schema.__init__: the schema info is the wrapped schema's.
        self._record_cls = bytes
        self._schema_info = schema.schema_info()

    def encode(self, obj: Any) -> bytes:
        return bytes(obj)

    def decode(self, data: bytes) -> bytes:
        return data


PASSED_THROUGH: tuple[type[Schema], ...] = (BytesSchema, _Encoded)
"""The producer schemas whose ``encode`` hands bytes back as they are: the instance's
producers declare one of these."""


def input_schema_serdes(
    config: FunctionConfig, function: LoadedFunction, paths: list[Path]
) -> dict[str, SerDe]:
    """Input topic -> the SerDe of its schema, for the inputs that have one."""
    serdes: dict[str, SerDe] = {}
    for topic, kind in config.input_schemas().items():
        record = None
        if kind.upper() in ("JSON", "AVRO"):
            record = _record_class(
                config.input_type_class_name, _input_annotation(function), paths, f"input {topic}"
            )
        serdes[topic] = _serde(kind.upper(), record)
    return serdes


def output_schema_serde(
    config: FunctionConfig, function: LoadedFunction, paths: list[Path]
) -> SchemaSerDe | None:
    """The SerDe of the output's schema, if it has one."""
    kind = (config.output_schema_type or "").upper()
    if not kind:
        return None
    record = None
    if kind in ("JSON", "AVRO"):
        record = _record_class(
            config.output_type_class_name, _return_annotation(function), paths, "the output"
        )
    return _serde(kind, record)


def _serde(kind: str, record: type[Record] | None) -> SchemaSerDe:
    if kind == "STRING":
        return SchemaSerDe(StringSchema(), kind)
    if kind == "BYTES":
        return SchemaSerDe(BytesSchema(), kind)
    assert record is not None
    return SchemaSerDe(JsonSchema(record) if kind == "JSON" else AvroSchema(record), kind)


def _record_class(
    class_name: str | None, annotation: Any, paths: list[Path], what: str
) -> type[Record]:
    record = load_attribute(class_name, paths) if class_name else annotation
    if record is None:
        side = "inputTypeClassName" if what.startswith("input") else "outputTypeClassName"
        raise FunctionLoadError(
            f"a JSON or AVRO schema for {what} needs its record class: set {side} "
            "(module.ClassName) or annotate process with it"
        )
    if not (inspect.isclass(record) and issubclass(record, Record)):
        raise FunctionLoadError(
            f"the record class for {what} must subclass pulsar.schema.Record, not {record!r}"
        )
    return record


def _hints(function: LoadedFunction) -> dict[str, Any]:
    try:
        return typing.get_type_hints(function.process)
    except Exception:  # annotations that do not resolve: no record class from them
        return {}


def _input_annotation(function: LoadedFunction) -> Any:
    parameters = [
        p
        for p in inspect.signature(function.process).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return _hints(function).get(parameters[0].name) if parameters else None


def _return_annotation(function: LoadedFunction) -> Any:
    return _hints(function).get("return")
