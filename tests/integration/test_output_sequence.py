"""Failover take-overs on Apache Pulsar. EFFECTIVELY_ONCE outputs on its deduplication when a
partition's inputs are handled out of order, as a take-over may hand them: every output is
stored, and none twice when the inputs are handled again (by the same instance after a
failed send, or by its successor). First at the seam (``Outputs`` fed inputs in an order
chosen here), then end to end on a broker configured to hand a take-over later inputs first
every time; on that broker, too, what a take-over's rewind left unsent is asked for."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.client import newest_first
from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions
from magnetar.instance.outputs import Outputs
from magnetar.testing import ApachePulsarStandalone
from magnetar.worker.broker_admin import BrokerAdmin
from tests.conftest import EXAMPLES, KEEP_ALIVE_S
from tests.integration.conftest import produce, python_file, wait_for

REORDERING = {
    "unblockStuckSubscriptionEnabled": "true",
    "statsUpdateInitialDelayInSecs": "1",
    "statsUpdateFrequencyInSecs": "1",
    "activeConsumerFailoverDelayTimeMillis": "4000",
}
"""A broker that hands a Failover take-over later messages first, every time: its check for
stuck subscriptions (on, every second) reads for the new active consumer before the take-over's
rewind (4 s later) sends what the old one left unacknowledged. Apache Pulsar's default
configuration does the same now and then (see ``output_sequence``)."""

SLOW = """
    import time

    def process(input, context):
        time.sleep(0.005)  # the killed instance holds many inputs received, not yet handled
        with open({handed!r}, "a") as handed:  # what the broker handed either instance
            handed.write(input + "\\n")
        return input + "!"
"""

VICTIM = """
import sys, time, pulsar
from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions
url, code, topic, output, name = sys.argv[1:]
client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
config = FunctionConfig(name=name, py=code, inputs=[topic], output=output,
                        processing_guarantees="EFFECTIVELY_ONCE", subscription_position="Earliest")
FunctionInstance(config, client, InstanceOptions(instance_id=1)).start()
print("started", flush=True)
time.sleep(600)
"""

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

    expected = [f"v{i}!" for i in range(6)]
    assert sorted(collect_all(client, output, set(expected), 30)) == expected


@pytest.fixture(scope="module")
def reordering_pulsar(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApachePulsarStandalone]:
    if request.config.getoption("apache_pulsar") != "maven":
        pytest.skip("starts an Apache Pulsar of its own from the jars `make apache-pulsar` fetched")
    with ApachePulsarStandalone(
        tmp_path_factory.mktemp("reordering-pulsar"),
        keep_alive_s=KEEP_ALIVE_S,
        quick_start=True,
        settings=REORDERING,
    ) as broker:
        yield broker


@pytest.mark.brokers("apache")
def test_a_take_over_handed_later_inputs_first_loses_no_output(
    reordering_pulsar: ApachePulsarStandalone,
    topic: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The active instance is killed (-9) holding inputs it received but had not handled; the
    other instance is handed later inputs first, then those. Every output is stored once."""
    broker = reordering_pulsar
    client = pulsar.Client(
        broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    # one partition: the active consumer is the one whose name sorts first, the newer
    created = broker.admin("PUT", f"/admin/v2/persistent/public/default/{topic}/partitions", json=1)
    assert created.status_code == 204, created.text
    output = deduplicated_output(client, broker.admin_url, f"{topic}-out")
    handed = tmp_path / "handed"
    code = python_file(tmp_path, "late_inputs.py", SLOW.format(handed=str(handed)))
    name = f"eo-{uuid.uuid4().hex[:6]}"
    config = FunctionConfig(
        name=name,
        py=code,
        inputs=[topic],
        output=output,
        processing_guarantees="EFFECTIVELY_ONCE",
        subscription_position="Earliest",
    )
    survivor = FunctionInstance(config, client, InstanceOptions(instance_id=0)).start()
    victim = subprocess.Popen(
        [sys.executable, "-c", VICTIM, broker.service_url, code, topic, output, name],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert victim.stdout is not None and victim.stdout.readline().strip() == "started"
        # subscribed (newer, its name sorts first), and the broker done with the changes of
        # active consumer that the two subscribing made
        time.sleep(6)
        # more than both instances prefetch: the survivor, handed the later ones first, is
        # still busy with them when the rewind comes (a broker that rewinds while a
        # consumer waits for new messages reads on from where it was, and never sends
        # what the rewind gave back)
        values = [f"v{i}" for i in range(3000)]
        send(client, topic, values)
        time.sleep(1)  # it has received many, handled some
        assert survivor.metrics.received == 0, "the killed instance was not the active one"
        os.kill(victim.pid, signal.SIGKILL)
        with caplog.at_level(logging.WARNING, logger="magnetar.instance.output_sequence"):
            outputs = collect_all(client, output, {f"{v}!" for v in values}, 60)
    finally:
        victim.kill()
        victim.wait()
        survivor.stop()
        survivor.wait(30)
        client.close()

    counts = Counter(outputs)
    missing = sorted(set(values) - {v[:-1] for v in counts}, key=lambda v: int(v[1:]))
    # An output lost is one of an input that was handed; an input never handed is one the
    # broker's rewind left unsent and the survivor did not ask for (see ``stranded``).
    lost = set(missing) & set(handed.read_text().split())
    assert not lost, f"{len(lost)} outputs lost of {len(missing)} missing, e.g. {missing[:5]}"
    assert not missing, f"{len(missing)} inputs never handed, e.g. {missing[:5]}"
    assert [v for v, n in counts.items() if n > 1] == []
    assert "came after later ones (a Failover take-over)" in caplog.text, (
        "the broker handed the survivor no later input first: the test showed nothing"
    )


def send(client: pulsar.Client, topic: str, values: Sequence[str]) -> None:
    """``values``, one message each, as fast as the broker takes them."""
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    for value in values:
        producer.send_async(value.encode(), None)
    producer.flush()
    producer.close()


def collect_all(client: pulsar.Client, topic: str, expected: set[str], timeout: float) -> list[str]:
    """The topic's outputs, repeats included, once all of ``expected`` arrived (or the
    timeout), and a moment more for late repeats. A message handed to the reader again (its
    id seen before) is not a repeat: an output stored twice has two ids."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    found: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                message = reader.read_next(2000)
            except pulsar.Timeout:
                if expected <= set(found.values()):
                    break
                continue
            if message.data() != _PROBE:
                found[str(message.message_id())] = message.data().decode()
        return list(found.values())
    finally:
        reader.close()


TAKE_OVERS = 5
"""Take-overs tried until the broker leaves messages unsent in one (it did in 5 of 6)."""
ASKS_AFTER_S = 8.0
"""The instance's ``stranded_check_s`` here: longer than the broker's rewind (4 s), so what
the broker sent and what the instance asked for are told apart."""


@pytest.mark.brokers("apache")
def test_what_a_take_over_left_unsent_is_asked_for(
    reordering_pulsar: ApachePulsarStandalone, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The active consumer leaves holding inputs it never acknowledged. Before the broker's
    delayed rewind, the broker hands the instance the inputs after them (it reads for the
    new active consumer without waiting for the rewind), and the instance, done with those,
    waits for more at the end of the topic. The rewind does not cancel that wait (Apache
    Pulsar 4.2.4), and no more inputs come. The instance, holding nothing, asks: every input
    has its output."""
    client = pulsar.Client(
        reordering_pulsar.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    try:
        for attempt in range(TAKE_OVERS):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="magnetar.instance.inputs"):
                handed, outputs = take_over(client, reordering_pulsar, f"{topic}-{attempt}")
            missing = sorted({f"v{i}!" for i in range(50)} - set(outputs))
            assert not missing, f"{len(missing)} inputs never handed to the instance: {missing}"
            twice = sorted(v for v, n in Counter(outputs).items() if n > 1)
            assert not twice, f"asked for, the broker sent acknowledged inputs again: {twice}"
            if handed < 50:
                assert f"{50 - handed} messages came once asked for" in caplog.text
                break
        else:
            pytest.fail(f"the broker left nothing unsent in {TAKE_OVERS} take-overs")
    finally:
        client.close()


def take_over(
    client: pulsar.Client, broker: ApachePulsarStandalone, topic: str
) -> tuple[int, list[str]]:
    """Another consumer takes 50 inputs from an instance and leaves; the inputs the instance
    was handed 2 s after the broker's rewind (before it asks), and the outputs."""
    created = broker.admin("PUT", f"/admin/v2/persistent/public/default/{topic}/partitions", json=1)
    assert created.status_code == 204, created.text
    config = FunctionConfig(
        name=f"ordered-{uuid.uuid4().hex[:6]}",
        py=str(EXAMPLES / "exclamation.py"),
        inputs=[topic],
        output=f"{topic}-out",
        retain_ordering=True,  # a Failover subscription
        subscription_position="Earliest",
    )
    options = InstanceOptions(instance_id=0, stranded_check_s=ASKS_AFTER_S)
    instance = FunctionInstance(config, client, options).start()
    values = [f"v{i}" for i in range(50)]
    try:
        leaving = client.subscribe(  # newer: its name sorts first, so it becomes the active one
            topic,
            config.subscription_name,
            consumer_type=pulsar.ConsumerType.Failover,
            consumer_name=f"{newest_first()}:leaving",
            receiver_queue_size=10,
        )
        time.sleep(6)  # the broker done with the change of active consumer
        produce(client, topic, values)
        assert leaving.receive(10_000).data() == b"v0" and instance.metrics.received == 0
        leaving.close()  # the instance's consumer is active again, the rewind 4 s away
        time.sleep(6)
        handed = instance.metrics.received
        return handed, collect_all(client, f"{topic}-out", {f"{v}!" for v in values}, 30)
    finally:
        instance.stop()
        instance.wait(30)
