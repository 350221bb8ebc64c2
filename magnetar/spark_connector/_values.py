"""Message payloads decoded by a topic's schema into Arrow columns, and values encoded back.

Encodings are Pulsar's (its Java schemas): STRING is UTF-8; INT8/16/32/64, FLOAT and DOUBLE
big-endian; BOOLEAN one byte; DATE and TIMESTAMP a big-endian long of milliseconds since the
epoch (dates at midnight UTC); JSON a JSON object; AVRO binary Avro without a header.
Primitive columns are decoded a whole batch at a time; JSON and AVRO one payload at a time.
"""

from __future__ import annotations

import datetime
import io
import json
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from magnetar.spark_connector._avro import converter
from magnetar.spark_connector._topic_schema import TopicSchema
from magnetar.spark_connector.exceptions import PulsarReadError, SchemaError

__all__ = ["Describe", "ValueDecoder", "encoder"]

Describe = Callable[[int], str]
"""Names the message at an index of a batch, for error messages."""

_FIXED: dict[str, tuple[int, str]] = {
    "INT8": (1, ">i1"),
    "INT16": (2, ">i2"),
    "INT32": (4, ">i4"),
    "INT64": (8, ">i8"),
    "FLOAT": (4, ">f4"),
    "DOUBLE": (8, ">f8"),
    "BOOLEAN": (1, "u1"),
    "DATE": (8, ">i8"),
    "TIMESTAMP": (8, ">i8"),
}
_PACK = {
    "INT8": ">b",
    "INT16": ">h",
    "INT32": ">i",
    "INT64": ">q",
    "FLOAT": ">f",
    "DOUBLE": ">d",
    "BOOLEAN": ">B",
    "DATE": ">q",
    "TIMESTAMP": ">q",
}
_DAY_MS = 86_400_000
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class ValueDecoder:
    """Payloads of one schema -> the Arrow arrays of its value columns."""

    def __init__(self, schema: TopicSchema) -> None:
        self.schema = schema
        fields = schema.value_fields()
        self._arrow = to_arrow_schema(StructType(fields), timezone="UTC")
        self._required = [f.name for f in fields if not f.nullable]
        self._reader: Callable[[bytes], Any] | None = None
        self._convert = None
        if schema.is_record:
            json_encoded = schema.type == "JSON"
            self._convert = converter(schema.avro, json_encoded)
            # fastavro resolves named types itself: it gets the definition as written.
            self._reader = (
                json.loads if json_encoded else _avro_reader(json.loads(schema.definition))
            )

    @property
    def arrow_fields(self) -> list[pa.Field]:
        return list(self._arrow)

    def decode(
        self, payloads: pa.BinaryArray | Sequence[bytes], describe: Describe
    ) -> list[pa.Array]:
        """One array per value column from a batch's payloads; :class:`PulsarReadError`
        naming the first message that does not decode."""
        if not isinstance(payloads, pa.Array):
            payloads = pa.array(payloads, pa.binary())
        kind = self.schema.type
        if self.schema.is_raw:
            return [payloads]
        if kind == "STRING":
            return [_text(payloads, describe)]
        if kind in _FIXED:
            return [self._fixed(payloads, describe)]
        return self._records(payloads, describe)

    def _fixed(self, payloads: pa.BinaryArray, describe: Describe) -> pa.Array:
        kind = self.schema.type
        width, dtype = _FIXED[kind]
        lengths = pc.binary_length(payloads)
        index = pc.index(pc.not_equal(lengths, width), True).as_py()
        if index >= 0:
            raise PulsarReadError(
                f"{describe(index)} is not a {kind} value: {lengths[index].as_py()} bytes, "
                f"expected {width}"
            )
        numbers = np.frombuffer(_data(payloads), dtype=dtype, count=len(payloads))
        arrow_type = self._arrow.field(0).type
        if kind == "BOOLEAN":
            return pa.array(numbers != 0, pa.bool_())
        if kind == "DATE":
            return pa.array(np.floor_divide(numbers, _DAY_MS).astype("int32"), pa.int32()).cast(
                arrow_type
            )
        if kind == "TIMESTAMP":
            return pa.array(numbers.astype("int64") * 1000, pa.int64()).cast(arrow_type)
        return pa.array(numbers.astype(numbers.dtype.newbyteorder("=")), arrow_type)

    def _records(self, payloads: pa.BinaryArray, describe: Describe) -> list[pa.Array]:
        assert self._reader is not None
        values = []
        for index, payload in enumerate(payloads.to_pylist()):
            try:
                value = self._reader(payload)
                values.append(self._convert(value) if self._convert else value)
            except Exception as error:
                raise PulsarReadError(
                    f"{describe(index)} cannot be decoded with the topic's "
                    f"{self.schema.type} schema: {error}"
                ) from None
        if not self.schema.flattened:
            return [self._array(values, self._arrow.field(0).type, describe)]
        struct_type = pa.struct(list(self._arrow))
        record = self._array(values, struct_type, describe)
        columns: list[pa.Array] = record.flatten()
        for name in self._required:
            column = columns[self._arrow.get_field_index(name)]
            if column.null_count:
                index = column.to_pylist().index(None)
                raise PulsarReadError(
                    f"{describe(index)} has no value for {name}, which the topic's "
                    f"{self.schema.type} schema requires"
                )
        return columns

    @staticmethod
    def _array(values: list[Any], arrow_type: pa.DataType, describe: Describe) -> pa.Array:
        try:
            return pa.array(values, arrow_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass
        for index, value in enumerate(values):  # name the first message that does not fit
            try:
                pa.array([value], arrow_type)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
                raise PulsarReadError(
                    f"{describe(index)} does not fit the topic's schema: {error}"
                ) from None
        raise AssertionError("unreachable: the batch failed but no value does")


def _data(payloads: pa.BinaryArray) -> pa.Buffer:
    """The bytes of a binary array's values, end to end (no nulls: payloads)."""
    offsets = np.frombuffer(payloads.buffers()[1], dtype=np.int32)
    first, last = payloads.offset, payloads.offset + len(payloads)
    data: pa.Buffer = payloads.buffers()[2]
    return data[int(offsets[first]) : int(offsets[last])] if data is not None else b""


def _text(payloads: pa.BinaryArray, describe: Describe) -> pa.Array:
    try:
        return payloads.cast(pa.string())
    except pa.ArrowInvalid:
        for index, payload in enumerate(payloads.to_pylist()):
            try:
                payload.decode()
            except UnicodeDecodeError as error:
                raise PulsarReadError(
                    f"{describe(index)} is not UTF-8 text, as the topic's STRING schema "
                    f"says: {error}"
                ) from None
        raise


def _avro_reader(definition: Any) -> Callable[[bytes], Any]:
    import fastavro

    parsed = fastavro.parse_schema(definition)

    def read(payload: bytes) -> Any:
        return fastavro.schemaless_reader(io.BytesIO(payload), parsed, None)

    return read


# --- writing -------------------------------------------------------------------------------

Encode = Callable[[Any], bytes]


def encoder(schema: TopicSchema) -> Encode:
    """Encodes one Python value (a record as a dict) in ``schema``'s encoding; raises
    :class:`SchemaError` for a value that does not fit."""
    kind = schema.type
    if schema.is_raw:
        return _raw
    if kind == "STRING":
        return _utf8
    if kind in _FIXED:
        return _fixed_encoder(kind)
    if kind == "JSON":
        return _json_encoder()
    return _avro_encoder(json.loads(schema.definition))


def _raw(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise SchemaError(f"{value!r} is neither bytes nor text, for a topic without a schema")


def _utf8(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise SchemaError(f"{value!r} is not text, for a topic with a STRING schema")


def _fixed_encoder(kind: str) -> Encode:
    packer = struct.Struct(_PACK[kind])

    def encode(value: Any) -> bytes:
        if kind == "DATE" and isinstance(value, datetime.date):
            value = (value - datetime.date(1970, 1, 1)).days * _DAY_MS
        elif kind == "TIMESTAMP" and isinstance(value, datetime.datetime):
            value = _millis(value)
        elif kind == "BOOLEAN":
            value = 1 if value else 0
        try:
            return packer.pack(value)
        except struct.error as error:
            raise SchemaError(f"{value!r} is not a {kind} value: {error}") from None

    return encode


def _millis(value: datetime.datetime) -> int:
    """Milliseconds since the epoch; a naive datetime (how Spark hands a timestamp to Python)
    is local time."""
    if value.tzinfo is None:
        value = value.astimezone()
    return (value - _EPOCH) // datetime.timedelta(milliseconds=1)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return _millis(value)
    if isinstance(value, datetime.date):
        return (value - datetime.date(1970, 1, 1)).days
    if isinstance(value, (bytes, bytearray)):
        import base64

        return base64.b64encode(value).decode()
    if hasattr(value, "as_integer_ratio"):  # Decimal
        return float(value)
    raise TypeError(f"{value!r} has no JSON form")


def _json_encoder() -> Encode:
    def encode(value: Any) -> bytes:
        try:
            return json.dumps(value, default=_json_default, separators=(",", ":")).encode()
        except (TypeError, ValueError) as error:
            raise SchemaError(f"{value!r} cannot be written as JSON: {error}") from None

    return encode


def _avro_encoder(definition: Any) -> Encode:
    import fastavro

    parsed = fastavro.parse_schema(definition)

    def encode(value: Any) -> bytes:
        out = io.BytesIO()
        try:
            fastavro.schemaless_writer(out, parsed, value)
        except (TypeError, ValueError, AttributeError, KeyError) as error:
            raise SchemaError(f"{value!r} does not fit the topic's AVRO schema: {error}") from None
        return out.getvalue()

    return encode
