"""The Spark connector's schema rules and encodings, without Spark: Avro records as
StreamNative types them, Pulsar's primitive encodings both ways, and the Java client option
names."""

from __future__ import annotations

import datetime
import io
import json
import struct
from typing import Any

import fastavro
import pulsar
import pytest
from pyspark.sql.types import (
    ArrayType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from magnetar.spark_connector._avro import avro_schema, spark_type
from magnetar.spark_connector._passthrough import (
    check_module_options,
    client_kwargs,
    producer_kwargs,
    reader_kwargs,
)
from magnetar.spark_connector._topic_schema import TopicSchema
from magnetar.spark_connector._values import ValueDecoder, encoder
from magnetar.spark_connector.exceptions import InvalidOptionError, PulsarReadError, SchemaError


def describe(index: int) -> str:
    return f"message #{index}"


@pytest.mark.parametrize(
    ("avro", "expected"),
    [
        ("int", (IntegerType(), False)),
        (["null", "string"], (StringType(), True)),
        (["string", "null"], (StringType(), True)),
        (["int", "long"], (LongType(), False)),
        (["float", "double"], (DoubleType(), False)),
        ({"type": "int", "logicalType": "date"}, (DateType(), False)),
        ({"type": "long", "logicalType": "timestamp-millis"}, (TimestampType(), False)),
        (
            {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
            (DecimalType(9, 2), False),
        ),
        ({"type": "enum", "name": "E", "symbols": ["A", "B"]}, (StringType(), False)),
        ({"type": "array", "items": "int"}, (ArrayType(IntegerType(), False), False)),
        (
            {"type": "map", "values": ["null", "long"]},
            (MapType(StringType(), LongType(), True), False),
        ),
        (
            ["int", "string"],
            (
                StructType(
                    [
                        StructField("member0", IntegerType(), True),
                        StructField("member1", StringType(), True),
                    ]
                ),
                False,
            ),
        ),
    ],
)
def test_avro_types_as_streamnative_maps_them(avro: Any, expected: Any) -> None:
    assert spark_type(avro) == expected


def test_recursive_records_are_refused() -> None:
    node = {
        "type": "record",
        "name": "Node",
        "namespace": "x",
        "fields": [{"name": "next", "type": ["null", "Node"]}],
    }
    with pytest.raises(SchemaError, match=r"Avro record x\.Node refers to itself"):
        TopicSchema.of("AVRO", json.dumps(node))


def test_a_named_type_used_twice_is_the_same_struct_both_times() -> None:
    point = {
        "type": "record",
        "name": "Point",
        "fields": [{"name": "x", "type": "int"}, {"name": "y", "type": "int"}],
    }
    line = {
        "type": "record",
        "name": "Line",
        "namespace": "geo",
        "fields": [{"name": "start", "type": point}, {"name": "end", "type": "Point"}],
    }
    schema = TopicSchema.of("AVRO", json.dumps(line))
    point_type = StructType(
        [StructField("x", IntegerType(), False), StructField("y", IntegerType(), False)]
    )
    assert schema.value_fields() == [
        StructField("start", point_type, False),
        StructField("end", point_type, False),
    ]
    payload = encoder(schema)({"start": {"x": 1, "y": 2}, "end": {"x": 3, "y": 4}})
    start, end = ValueDecoder(schema).decode([payload], describe)
    assert (start.to_pylist(), end.to_pylist()) == ([{"x": 1, "y": 2}], [{"x": 3, "y": 4}])


def test_written_records_are_streamnatives_top_level_record() -> None:
    columns = StructType(
        [StructField("name", StringType(), True), StructField("n", IntegerType(), False)]
    )
    assert avro_schema(columns) == {
        "type": "record",
        "name": "topLevelRecord",
        "namespace": "",
        "fields": [
            {"name": "name", "type": ["string", "null"]},
            {"name": "n", "type": "int"},
        ],
    }


@pytest.mark.parametrize(
    ("kind", "value", "payload"),
    [
        ("INT8", -2, b"\xfe"),
        ("INT16", 258, b"\x01\x02"),
        ("INT32", 42, b"\x00\x00\x00\x2a"),
        ("INT64", -1, b"\xff" * 8),
        ("FLOAT", 1.5, struct.pack(">f", 1.5)),
        ("DOUBLE", -0.25, struct.pack(">d", -0.25)),
        ("BOOLEAN", True, b"\x01"),
        ("STRING", "héllo", "héllo".encode()),
        ("DATE", datetime.date(2024, 2, 29), struct.pack(">q", 1_709_164_800_000)),
        (
            "TIMESTAMP",
            datetime.datetime(2024, 3, 1, 12, 0, tzinfo=datetime.UTC),
            struct.pack(">q", 1_709_294_400_000),
        ),
    ],
)
def test_primitives_encode_as_pulsars_java_schemas_and_decode_back(
    kind: str, value: Any, payload: bytes
) -> None:
    schema = TopicSchema.of(kind)
    assert encoder(schema)(value) == payload
    (column,) = ValueDecoder(schema).decode([payload], describe)
    assert column.to_pylist() == [value]


def test_a_payload_of_the_wrong_size_names_its_message() -> None:
    decoder = ValueDecoder(TopicSchema.of("INT64"))
    with pytest.raises(PulsarReadError, match="message #1 is not a INT64 value: 3 bytes"):
        decoder.decode([b"\x00" * 8, b"abc"], describe)


def test_avro_records_decode_into_flattened_columns() -> None:
    record = {
        "type": "record",
        "name": "Event",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "tags", "type": {"type": "map", "values": "string"}},
        ],
    }
    schema = TopicSchema.of("AVRO", json.dumps(record))
    at = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    payloads = []
    for i in range(3):
        out = io.BytesIO()
        fastavro.schemaless_writer(
            out, fastavro.parse_schema(record), {"id": i, "at": at, "tags": {"k": str(i)}}
        )
        payloads.append(out.getvalue())

    ids, times, tags = ValueDecoder(schema).decode(payloads, describe)

    assert ids.to_pylist() == [0, 1, 2]
    assert times.to_pylist() == [at] * 3
    assert tags.to_pylist() == [[("k", "0")], [("k", "1")], [("k", "2")]]
    assert encoder(schema)({"id": 0, "at": at, "tags": {"k": "0"}}) == payloads[0]


def test_json_records_take_times_as_numbers_and_report_what_is_missing() -> None:
    record = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "id", "type": "int"},
            {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
        ],
    }
    decoder = ValueDecoder(TopicSchema.of("JSON", json.dumps(record)))

    ids, days = decoder.decode([b'{"id": 1, "day": 19000}', b'{"id": 2}'], describe)
    assert ids.to_pylist() == [1, 2]
    assert days.to_pylist() == [datetime.date(2022, 1, 8), None]

    with pytest.raises(PulsarReadError, match="message #0 has no value for id"):
        decoder.decode([b'{"day": 1}'], describe)
    with pytest.raises(PulsarReadError, match=r"message #0 cannot be decoded with .* JSON"):
        decoder.decode([b"{nope"], describe)


def test_schema_options_are_checked() -> None:
    with pytest.raises(SchemaError, match="needs its Avro record definition"):
        TopicSchema.of("AVRO")
    with pytest.raises(SchemaError, match="TIME schema has no Spark counterpart"):
        TopicSchema.of("TIME")
    with pytest.raises(SchemaError, match="schema type 'XML' is not supported"):
        TopicSchema.of("XML")


def test_java_option_names_become_python_client_settings() -> None:
    opts = {
        "pulsar.client.operationtimeoutms": "2500",
        "pulsar.client.numiothreads": "3",
        "pulsar.client.keepaliveintervalseconds": "10",
        "pulsar.reader.receiverqueuesize": "50",
        "pulsar.producer.compressiontype": "LZ4",
        "pulsar.producer.batchingmaxpublishdelaymicros": "2500",
    }
    client = check_module_options("client", opts)
    assert client == {
        "operationTimeoutMs": "2500",
        "numIoThreads": "3",
        "keepAliveIntervalSeconds": "10",
    }
    assert client_kwargs(client) == {"operation_timeout_seconds": 3, "io_threads": 3}
    assert reader_kwargs(check_module_options("reader", opts)) == {"receiver_queue_size": 50}
    assert producer_kwargs(check_module_options("producer", opts)) == {
        "compression_type": pulsar.CompressionType.LZ4,
        "batching_max_publish_delay_ms": 3,
    }


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("pulsar.client.nosuchfield", "1", "nosuchfield not supported by pulsar"),
        ("pulsar.client.usekeystoretls", "true", "Java KeyStores are Java-only"),
        ("pulsar.producer.compressiontype", "brotli", "must be one of LZ4, NONE, SNAPPY"),
        ("pulsar.producer.properties", "[1]", "must be a JSON object of strings"),
    ],
)
def test_bad_pass_through_settings_name_the_option(key: str, value: str, message: str) -> None:
    module = key.split(".")[1]
    with pytest.raises(InvalidOptionError, match=message):
        check_module_options(module, {key: value})  # type: ignore[arg-type]
