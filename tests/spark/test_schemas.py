"""Values typed by the topic's schema, as StreamNative's connector types them.

Topics are produced with pulsar-client's schema API. pulsar-lite keeps no schemas (it leaves
the binary protocol's schema lookup unanswered), so reads of those topics name the schema
with ``schema.type`` / ``schema.definition``; topics the connector itself wrote carry the
schema it recorded, as a broker's registry would.
"""

from __future__ import annotations

import datetime
import io
from typing import Any

import fastavro
import pulsar
import pytest
from pulsar.schema import AvroSchema, Double, Integer, JsonSchema, Record, String, StringSchema
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from tests.spark.conftest import full, position, read

pytestmark = pytest.mark.spark

META = ["__key", "__topic", "__messageId", "__publishTime", "__eventTime", "__messageProperties"]


class Reading(Record):
    sensor = String()
    value = Double()
    count = Integer()


def send_records(client: pulsar.Client, topic: str, schema: Any, values: list[Any]) -> list[Any]:
    producer = client.create_producer(topic, schema=schema, batching_enabled=True)
    ids = [producer.send(value) for value in values]
    producer.close()
    return ids


def record_options(schema: Any) -> dict[str, str]:
    info = schema.schema_info()
    return {"schema.type": info.schema_type().name, "schema.definition": info.schema()}


def in_order(frame: DataFrame) -> list[Any]:
    rows = frame.collect()
    rows.sort(key=lambda row: (row["__topic"], position(row["__messageId"])))
    return rows


READINGS = [Reading(sensor=f"s{i}", value=i / 4, count=i) for i in range(25)]


@pytest.mark.parametrize("make_schema", [JsonSchema, AvroSchema], ids=["json", "avro"])
def test_json_and_avro_values_are_flattened_into_columns(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, make_schema: Any
) -> None:
    schema = make_schema(Reading)
    ids = send_records(client, topic, schema, READINGS)

    frame = read(spark, broker_url, topic=topic, **record_options(schema))

    assert frame.schema.fields[:3] == [
        StructField("sensor", StringType(), True),  # the Python client makes every field
        StructField("value", DoubleType(), True),  # a union with null: nullable
        StructField("count", IntegerType(), True),
    ]
    assert frame.columns[3:] == META
    rows = in_order(frame)
    assert [(r.sensor, r.value, r["count"]) for r in rows] == [
        (r.sensor, r.value, r.count) for r in READINGS
    ]
    assert [bytes(r["__messageId"]) for r in rows] == [i.serialize() for i in ids]


def test_string_values_are_strings(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    send_records(client, topic, StringSchema(), ["héllo", "wörld", ""])

    frame = read(spark, broker_url, topic=topic, **{"schema.type": "STRING"})

    assert frame.schema["value"] == StructField("value", StringType(), False)
    assert [r.value for r in in_order(frame)] == ["héllo", "wörld", ""]


def test_a_topic_without_schema_gives_bytes(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    send_records(client, topic, pulsar.schema.BytesSchema(), [b"\x00\xff", b"x"])

    frame = read(spark, broker_url, topic=topic)

    assert frame.schema["value"] == StructField("value", BinaryType(), False)
    assert [bytes(r.value) for r in in_order(frame)] == [b"\x00\xff", b"x"]


@pytest.mark.parametrize(
    ("ddl", "rows", "spark_type"),
    [
        ("value int", [(1,), (-7,), (2**31 - 1,)], "int"),
        ("value bigint", [(2**40,), (-1,)], "bigint"),
        ("value double", [(0.5,), (-2.25,)], "double"),
        ("value float", [(1.5,), (-0.25,)], "float"),
        ("value boolean", [(True,), (False,)], "boolean"),
        ("value tinyint", [(-3,), (100,)], "tinyint"),
        ("value smallint", [(-300,), (3000,)], "smallint"),
        ("value date", [(datetime.date(2024, 2, 29),), (datetime.date(1969, 12, 31),)], "date"),
        (
            "value timestamp",
            [(datetime.datetime(2024, 3, 1, 12, 30, 15, 123000),)],
            "timestamp",
        ),
        ("value string", [("a",), ("ü",)], "string"),
    ],
)
def test_primitive_columns_round_trip_with_their_type(
    spark: SparkSession, broker_url: str, topic: str, ddl: str, rows: list[Any], spark_type: str
) -> None:
    """One value column is written with the primitive schema of its type (StreamNative's
    writer), which pulsar-lite's readers get from the connector's schema record."""
    spark.createDataFrame(rows, ddl).write.format("pulsar").option(
        "service.url", broker_url
    ).option("topic", topic).mode("append").save()

    frame = read(spark, broker_url, topic=topic)

    assert frame.schema["value"].dataType.simpleString() == spark_type
    assert sorted(r.value for r in frame.collect()) == sorted(v for (v,) in rows)


def test_pulsar_encodings_of_primitives(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    """Big-endian as Pulsar's Java schemas: what another client sent reads right."""
    producer = client.create_producer(topic)
    for payload in (b"\x00\x00\x00\x2a", b"\xff\xff\xff\xfe"):
        producer.send(payload)
    producer.close()

    frame = read(spark, broker_url, topic=topic, **{"schema.type": "INT32"})

    assert [r.value for r in in_order(frame)] == [42, -2]


def test_a_payload_that_does_not_fit_names_the_message(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"\x00\x00\x00\x01")
    bad = producer.send(b"\x01\x02")
    producer.close()

    with pytest.raises(Exception, match=r"is not a INT32 value: 2 bytes, expected 4") as caught:
        read(spark, broker_url, topic=topic, **{"schema.type": "INT32"}).collect()
    assert f"message ({bad.ledger_id()}, {bad.entry_id()}, -1) of {full(topic)}" in str(
        caught.value
    )


def test_struct_columns_are_written_as_avro_and_read_back_as_columns(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    """Several value columns are an AVRO record (StreamNative's writer): pulsar-client's
    AvroSchema decodes what Spark wrote, and Spark reads it back as the same columns."""
    frame = spark.createDataFrame(
        [(f"s{i}", i / 2, i, f"k{i}") for i in range(10)],
        "sensor string, value double, count int, __key string",
    )
    frame.write.format("pulsar").option("service.url", broker_url).option("topic", topic).mode(
        "append"
    ).save()

    back = read(spark, broker_url, topic=topic)
    assert back.schema.fields[:3] == [
        StructField("sensor", StringType(), True),
        StructField("value", DoubleType(), True),
        StructField("count", IntegerType(), True),
    ]
    assert sorted((r.sensor, r.value, r["count"], bytes(r["__key"])) for r in back.collect()) == [
        (f"s{i}", i / 2, i, f"k{i}".encode()) for i in range(10)
    ]

    consumer = client.subscribe(
        topic, "avro-check", initial_position=pulsar.InitialPosition.Earliest
    )
    payloads = [consumer.receive(5000).data() for _ in range(10)]
    consumer.close()
    # (pulsar-client's AvroSchema would first ask the broker for the writer's schema,
    # which pulsar-lite never answers: decode with fastavro, as it does.)
    writer = fastavro.parse_schema(_top_level_record())
    decoded = [fastavro.schemaless_reader(io.BytesIO(p), writer, None) for p in payloads]
    assert sorted(d["sensor"] for d in decoded) == sorted(f"s{i}" for i in range(10))


def _top_level_record() -> dict[str, Any]:
    """The record StreamNative's writer derives from ``sensor string, value double, count
    int`` (nullable columns are unions with null, null second)."""
    return {
        "type": "record",
        "name": "topLevelRecord",
        "namespace": "",
        "fields": [
            {"name": "sensor", "type": ["string", "null"]},
            {"name": "value", "type": ["double", "null"]},
            {"name": "count", "type": ["int", "null"]},
        ],
    }


def test_rows_written_to_a_json_topic_are_json(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    """With the topic's schema given, the writer encodes by it: pulsar-client's JsonSchema
    consumer decodes the rows into its records."""
    schema = JsonSchema(Reading)
    frame = spark.createDataFrame(
        [("a", 1.5, 3), ("b", None, 4)], "sensor string, value double, count int"
    )

    frame.write.format("pulsar").option("service.url", broker_url).option("topic", topic).options(
        **record_options(schema)
    ).mode("append").save()

    consumer = client.subscribe(
        topic, "json-check", schema=schema, initial_position=pulsar.InitialPosition.Earliest
    )
    got = sorted(
        (r.sensor, r.value, r.count) for r in (consumer.receive(5000).value() for _ in range(2))
    )
    consumer.close()
    assert got == [("a", 1.5, 3), ("b", None, 4)]


def test_columns_that_do_not_fit_the_topic_schema_are_refused(
    spark: SparkSession, broker_url: str, topic: str
) -> None:
    frame = spark.createDataFrame([("a", 1)], "sensor string, speed int")
    with pytest.raises(Exception, match=r"schema without the field\(s\) speed"):
        frame.write.format("pulsar").option("service.url", broker_url).option(
            "topic", topic
        ).options(**record_options(JsonSchema(Reading))).mode("append").save()


def test_topics_with_different_schemas(spark: SparkSession, broker_url: str, topic: str) -> None:
    """Read together only as bytes (allowDifferentTopicSchemas), as StreamNative."""
    for suffix, ddl, rows in (("a", "value int", [(1,)]), ("b", "value string", [("x",)])):
        spark.createDataFrame(rows, ddl).write.format("pulsar").option(
            "service.url", broker_url
        ).option("topic", f"{topic}-{suffix}").mode("append").save()
    topics = f"{topic}-a,{topic}-b"

    with pytest.raises(Exception, match="Topics to read must share identical schema"):
        read(spark, broker_url, topics=topics).count()

    raw = read(spark, broker_url, topics=topics, allowDifferentTopicSchemas="true")
    assert raw.schema["value"].dataType == BinaryType()
    assert sorted(bytes(r.value) for r in raw.collect()) == [b"\x00\x00\x00\x01", b"x"]


def test_a_schema_given_to_the_query_must_match(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    send_records(client, topic, StringSchema(), ["a"])
    given = StructType(
        [StructField("value", LongType()), *read(spark, broker_url, topic=topic).schema[1:]]
    )

    with pytest.raises(Exception, match="The Schema of Pulsar source and provided doesn't match"):
        spark.read.format("pulsar").schema(given).option("service.url", broker_url).option(
            "topic", topic
        ).load().count()
