"""Schemas for Python functions: JSON and AVRO records in and out, STRING and BYTES, the
output topic's schema registered, and a message that does not fit counted and dead-lettered."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String

from magnetar.instance import FunctionConfig, FunctionInstance, FunctionLoadError
from magnetar.instance.exceptions import InvalidFunctionConfigError
from tests.integration.conftest import RunFunction, collect, produce, values, wait_for

RECORDS = """
from pulsar import Function
from pulsar.schema import Integer, Record, String


class Order(Record):
    item = String()
    quantity = Integer()


class Line(Record):
    item = String()
    total = Integer()


class Price(Function):
    def process(self, order: Order, context) -> Line:
        return Line(item=order.item.upper(), total=order.quantity * 3)


class Untyped(Function):
    def process(self, order, context):
        return Line(item=order.item, total=order.quantity)
"""


class Order(Record):
    item = String()
    quantity = Integer()


class Line(Record):
    item = String()
    total = Integer()


@pytest.fixture
def records(tmp_path: Path) -> str:
    path = tmp_path / "pricing.py"
    path.write_text(textwrap.dedent(RECORDS))
    return str(path)


def send_orders(client: pulsar.Client, topic: str, orders: list[Order]) -> None:
    producer = client.create_producer(topic, schema=JsonSchema(Order))
    for order in orders:
        producer.send(order)
    producer.close()


def test_json_records_in_and_avro_records_out_from_the_annotations(
    client: pulsar.Client, run_function: RunFunction, topic: str, records: str
) -> None:
    send_orders(client, topic, [Order(item="tea", quantity=2), Order(item="jam", quantity=5)])
    run_function(
        py=records,
        class_name="pricing.Price",
        inputs=[topic],
        input_specs={topic: {"schemaType": "JSON"}},
        output=f"{topic}-out",
        output_schema_type="AVRO",
    )
    lines = [AvroSchema(Line).decode(m.data()) for m in collect(client, f"{topic}-out", 2)]
    assert [(line.item, line.total) for line in lines] == [("TEA", 6), ("JAM", 15)]


def test_record_classes_named_in_the_config(
    client: pulsar.Client, run_function: RunFunction, topic: str, records: str
) -> None:
    send_orders(client, topic, [Order(item="fig", quantity=1)])
    run_function(
        py=records,
        class_name="pricing.Untyped",
        inputs=[topic],
        custom_schema_inputs={topic: "JSON"},
        input_type_class_name="pricing.Order",
        output=f"{topic}-out",
        output_schema_type="JSON",
        output_type_class_name="pricing.Line",
    )
    line = JsonSchema(Line).decode(collect(client, f"{topic}-out", 1)[0].data())
    assert (line.item, line.total) == ("fig", 1)


def test_string_schema_in_and_out(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    produce(client, topic, ["ahoy"])
    run_function(
        "native_exclamation.py",
        inputs=[topic],
        input_specs={topic: {"schemaType": "STRING"}},
        output=f"{topic}-out",
        output_schema_type="STRING",
    )
    assert values(collect(client, f"{topic}-out", 1)) == ["ahoy!"]


def test_a_message_that_does_not_fit_is_counted_and_dead_lettered(
    client: pulsar.Client, run_function: RunFunction, topic: str, records: str
) -> None:
    send_orders(client, topic, [Order(item="ok", quantity=1)])
    produce(client, topic, ["not json at all"])
    instance = run_function(
        py=records,
        class_name="pricing.Price",
        inputs=[topic],
        input_specs={topic: {"schemaType": "JSON"}},
        output=f"{topic}-out",
        output_schema_type="AVRO",
        max_message_retries=1,
        dead_letter_topic=f"{topic}-dlq",
    )
    assert values(collect(client, f"{topic}-dlq", 1, timeout=20)) == ["not json at all"]
    assert len(collect(client, f"{topic}-out", 1)) == 1
    wait_for(lambda: instance.metrics.system_exceptions == 2)
    assert "does not fit the JSON schema" in (
        instance.snapshot().latest_system_exceptions[-1].exception_string
    )


def test_schema_mistakes_are_refused_with_the_reason(
    client: pulsar.Client, topic: str, records: str
) -> None:
    with pytest.raises(InvalidFunctionConfigError, match=r"has a SerDe .* and a schema type"):
        FunctionConfig.parse(
            {
                "name": "both",
                "py": records,
                "inputs": [topic],
                "customSerdeInputs": {topic: "serde.IdentitySerDe"},
                "inputSpecs": {topic: {"schemaType": "JSON"}},
            }
        )
    with pytest.raises(InvalidFunctionConfigError, match="must be one of STRING, BYTES"):
        FunctionConfig.parse(
            {"name": "odd", "py": records, "inputs": [topic], "outputSchemaType": "PROTOBUF"}
        )
    untyped = FunctionConfig(
        name="untyped",
        py=records,
        class_name="pricing.Untyped",
        inputs=[topic],
        input_specs={topic: {"schemaType": "AVRO"}},
    )
    with pytest.raises(FunctionLoadError, match="needs its record class: set inputTypeClassName"):
        FunctionInstance(untyped, client).start()
