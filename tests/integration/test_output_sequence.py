"""EFFECTIVELY_ONCE outputs on Apache Pulsar's deduplication when a partition's inputs are
handled out of order, as a Failover take-over may hand them: every output is stored, and none
twice when the inputs are handled again (by the same instance after a failed send, or by
its successor)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pulsar
import pytest

from magnetar.instance import FunctionConfig, InstanceOptions
from magnetar.instance.outputs import Outputs
from magnetar.worker.broker_admin import BrokerAdmin
from tests.conftest import EXAMPLES
from tests.integration.conftest import produce, wait_for

_PROBE = b"probe"


def deduplicated_output(client: pulsar.Client, admin_url: str, topic: str) -> str:
    """A new output topic whose deduplication is on, once the broker applies it (the
    topic policy takes effect a moment after the admin call returns)."""
    admin = BrokerAdmin(admin_url)
    admin.create_topic(topic)
    admin.enable_deduplication(topic)
    admin.close()
    probe = client.create_producer(topic, producer_name=f"probe-{uuid.uuid4().hex[:6]}")
    probe.send(_PROBE, sequence_id=1_000_000)
    wait_for(lambda: str(probe.send(_PROBE, sequence_id=1)) == "(-1,-1,-1,-1)", 10)
    probe.close()
    return topic


def received(client: pulsar.Client, topic: str, count: int) -> list[Any]:
    consumer = client.subscribe(topic, "inputs", initial_position=pulsar.InitialPosition.Earliest)
    messages = [consumer.receive(10_000) for _ in range(count)]
    consumer.close()
    return messages


def stored(client: pulsar.Client, topic: str) -> list[str]:
    """Every output the topic holds, repeats included (not the probes)."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    values: list[str] = []
    try:
        while True:
            try:
                data = reader.read_next(2000).data()
            except pulsar.Timeout:
                return values
            if data != _PROBE:
                values.append(data.decode())
    finally:
        reader.close()


@pytest.mark.brokers("apache")
def test_outputs_of_inputs_handled_out_of_order_are_stored_once(
    client: pulsar.Client, apache_pulsar: Any, topic: str
) -> None:
    output = deduplicated_output(client, apache_pulsar.admin_url, f"{topic}-out")
    produce(client, topic, [f"v{i}" for i in range(6)])
    inputs = received(client, topic, 6)
    config = FunctionConfig(
        name=f"eo-{uuid.uuid4().hex[:6]}",
        py=str(EXAMPLES / "exclamation.py"),
        inputs=[topic],
        output=output,
        processing_guarantees="EFFECTIVELY_ONCE",
    )

    def handle(order: Sequence[int]) -> None:
        """An instance's outputs of the inputs at these indexes, in this order."""
        outputs = Outputs(client, config, InstanceOptions(), threading.Event())
        try:
            for index in order:
                message = inputs[index]
                partition = message.topic_name()
                kwargs = outputs.result_kwargs(message, message.message_id(), partition)
                outputs.output_for(partition).send(message.data() + b"!", **kwargs)
        finally:
            outputs.close()

    handle([3, 4, 5, 0, 1, 2, 0])  # taken over out of order; the last one sent again
    handle(range(6))  # its successor, handed everything again

    assert sorted(stored(client, output)) == [f"v{i}!" for i in range(6)]
