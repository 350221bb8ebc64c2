"""A function instance against the real broker: Apache Pulsar-style functions, unchanged."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pulsar
import pytest

from magnetar.instance import FunctionConfig, FunctionInstance, InstanceError, InstanceOptions
from tests.conftest import EXAMPLES
from tests.integration.conftest import RunFunction, collect, produce, values, wait_for


@pytest.mark.brokers("lite", "apache")
def test_exclamation_class_outputs_each_input_with_pulsar_properties(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    run_function(
        "exclamation.py",
        class_name="exclamation.ExclamationFunction",
        inputs=[topic],
        output=f"{topic}-out",
    )
    producer = client.create_producer(topic)
    sent = [
        producer.send(
            f"hello-{i}".encode(),
            properties={"origin": "test"},
            partition_key=f"key-{i}",
            event_timestamp=1_700_000_000_000 + i,
        )
        for i in range(20)
    ]
    out = collect(client, f"{topic}-out", 20)
    assert values(out) == [f"hello-{i}!" for i in range(20)]
    first = out[0]
    assert first.partition_key() == ""  # Apache's Python runtime sends the result without a key
    assert first.event_timestamp() == 1_700_000_000_000
    properties = first.properties()
    assert properties["origin"] == "test"
    assert properties["__pfn_input_topic__"] == f"persistent://public/default/{topic}"
    input_id = pulsar.MessageId.deserialize(base64.b64decode(properties["__pfn_input_msg_id__"]))
    assert (input_id.ledger_id(), input_id.entry_id()) == (sent[0].ledger_id(), sent[0].entry_id())


def test_plain_process_function_and_status(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    instance = run_function("native_exclamation.py", inputs=[topic], output=f"{topic}-out")
    produce(client, topic, ["a", "b", "c"])
    assert values(collect(client, f"{topic}-out", 3)) == ["a!", "b!", "c!"]
    wait_for(lambda: instance.metrics.processed == 3)
    status = instance.snapshot().status()["status"]
    assert status["running"] is True
    assert status["numReceived"] == 3
    assert status["numSuccessfullyProcessed"] == 3
    assert status["numUserExceptions"] == 0
    assert status["lastInvocationTime"] > 0
    stats = instance.snapshot().stats()["metrics"]
    assert stats["processedSuccessfullyTotal"] == 3
    assert stats["avgProcessLatency"] >= 0


KEYS_AND_METRICS = """
from pulsar import Function


class KeyAndMetric(Function):
    def process(self, input, context):
        context.record_metric("size", len(input))
        return "key " + context.get_message_key() + "|" + context.get_partition_key()
"""


def test_a_message_without_a_key_has_the_empty_key_and_metrics_are_sum_and_count(
    client: pulsar.Client, run_function: RunFunction, topic: str, tmp_path: Path
) -> None:
    """As Apache Pulsar's Python runtime: ``''`` for no key (concatenating it works), user
    metrics in stats as ``user_metric_<name>_sum`` and ``_count``."""
    code = tmp_path / "keys_and_metrics.py"
    code.write_text(KEYS_AND_METRICS)
    instance = run_function(
        py=str(code),
        class_name="keys_and_metrics.KeyAndMetric",
        inputs=[topic],
        output=f"{topic}-out",
    )
    producer = client.create_producer(topic)
    producer.send(b"abc", partition_key="k1")
    producer.send(b"defgh")
    producer.close()
    out = collect(client, f"{topic}-out", 2)
    assert values(out) == ["key k1|k1", "key |"]
    assert [m.partition_key() for m in out] == ["", ""]
    wait_for(lambda: instance.metrics.processed == 2)
    assert instance.snapshot().stats()["metrics"]["userMetrics"] == {
        "user_metric_size_sum": 8.0,
        "user_metric_size_count": 2.0,
    }


def test_numbers_pass_through_identity_serde(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    # IdentitySerDe turns "41" into the int 41, so `input + '!'` fails; the SDK's plain
    # process function below adds 1 instead.
    (EXAMPLES.parent / "build").mkdir(exist_ok=True)
    source = EXAMPLES.parent / "build" / "increment_fn.py"
    source.write_text("def process(input):\n    return input + 1\n")
    run_function(py=str(source), inputs=[topic], output=f"{topic}-out")
    produce(client, topic, ["41", "1.5"])
    assert values(collect(client, f"{topic}-out", 2)) == ["42", "2.5"]


def test_word_split_publishes_every_word(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    run_function("word_split.py", inputs=[topic], output=f"{topic}-words")
    produce(client, topic, ["the quick brown fox", "jumps over"])
    assert values(collect(client, f"{topic}-words", 6)) == [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
    ]


def test_user_config_and_secrets(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    run_function(
        "user_config.py",
        inputs=[topic],
        output=f"{topic}-out",
        user_config={"greeting": "Hi", "times": 2},
    )
    produce(client, topic, ["Ada"])
    assert values(collect(client, f"{topic}-out", 1)) == ["Hi, Ada Hi, Ada"]

    source = EXAMPLES.parent / "build" / "secret_fn.py"
    source.parent.mkdir(exist_ok=True)
    source.write_text(
        "def process(input, context):\n"
        '    return f\'{context.get_secret("db_password")}/{context.get_secret("other")}\'\n'
    )
    run_function(
        py=str(source),
        inputs=[f"{topic}-s"],
        output=f"{topic}-s-out",
        secrets={"db_password": "s3cret"},  # Apache's default provider: the value itself
    )
    produce(client, f"{topic}-s", ["x"])
    assert values(collect(client, f"{topic}-s-out", 1)) == ["s3cret/None"]


def test_publish_to_another_topic_with_properties(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    run_function(
        "publish.py",
        name="publisher",
        inputs=[topic],
        user_config={"publish-topic": f"{topic}-side"},
    )
    produce(client, topic, ["one", "two"])
    out = collect(client, f"{topic}-side", 2)
    assert values(out) == ["one!", "two!"]
    assert out[0].properties()["source"] == "publisher"


def test_logs_go_to_the_log_topic(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    run_function(
        "logging_function.py", inputs=[topic], output=f"{topic}-out", log_topic=f"{topic}-logs"
    )
    produce(client, topic, ["fine", "danger!"])
    assert values(collect(client, f"{topic}-out", 2)) == ["fine", "danger!"]
    logs = collect(client, f"{topic}-logs", 3)
    lines = values(logs)
    assert len(lines) == 3
    assert "got fine from persistent://public/default/" in lines[0]
    # Apache's Python runtime format: [2026-11-25 03:26:45 +0000] [WARNING]: message
    assert re.fullmatch(
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}\] \[WARNING\]: a dangerous input: danger!",
        lines[2],
    )
    assert logs[2].properties()["loglevel"] == "WARNING"
    assert logs[2].properties()["fqn"].startswith("public/default/")


@pytest.mark.brokers("lite", "apache")
def test_user_exception_is_counted_and_the_instance_goes_on(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    instance = run_function(
        "fragile.py",
        inputs=[topic],
        output=f"{topic}-out",
        max_message_retries=2,
        dead_letter_topic=f"{topic}-dlq",
    )
    produce(client, topic, ["a", "boom-1", "b"])
    assert sorted(values(collect(client, f"{topic}-out", 2))) == ["A", "B"]
    dead = collect(client, f"{topic}-dlq", 1, timeout=20)
    assert values(dead) == ["boom-1"]
    wait_for(lambda: instance.metrics.user_exceptions == 3)  # first try + 2 retries
    status = instance.snapshot().status()["status"]
    assert status["numUserExceptions"] == 3
    assert (
        "ValueError: cannot handle 'boom-1'" in status["latestUserExceptions"][0]["exceptionString"]
    )
    assert status["numSuccessfullyProcessed"] == 2


def test_undecodable_message_is_a_system_exception_and_dead_lettered(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    instance = run_function(
        "json_serde.py",
        class_name="json_serde.DoubleAmountFunction",
        custom_serde_inputs={topic: "json_serde.JsonSerDe"},
        output=f"{topic}-out",
        output_serde_class_name="json_serde.JsonSerDe",
        max_message_retries=1,
        dead_letter_topic=f"{topic}-dlq",
    )
    produce(client, topic, [json.dumps({"amount": 2}), "not json", json.dumps({"amount": 5})])
    out = collect(client, f"{topic}-out", 2)
    assert sorted(json.loads(m.data())["amount"] for m in out) == [4, 10]
    assert values(collect(client, f"{topic}-dlq", 1, timeout=20)) == ["not json"]
    wait_for(lambda: instance.metrics.system_exceptions >= 1)
    latest = instance.snapshot().latest_system_exceptions[0].exception_string
    assert "cannot deserialize message" in latest and "JsonSerDe" in latest


def test_unserializable_result_is_reported(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    source = EXAMPLES.parent / "build" / "dict_fn.py"
    source.parent.mkdir(exist_ok=True)
    source.write_text("def process(input):\n    return {'value': input}\n")
    instance = run_function(py=str(source), inputs=[topic], output=f"{topic}-out")
    produce(client, topic, ["x"])
    wait_for(lambda: instance.metrics.system_exceptions >= 1)
    assert (
        "outputSerdeClassName" in instance.snapshot().latest_system_exceptions[0].exception_string
    )


def test_state_without_a_store_says_it_is_not_configured(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    source = EXAMPLES.parent / "build" / "counter_fn.py"
    source.parent.mkdir(exist_ok=True)
    source.write_text("def process(input, context):\n    context.incr_counter(input, 1)\n")
    instance = run_function(py=str(source), inputs=[topic], processing_guarantees="ATMOST_ONCE")
    produce(client, topic, ["word"])
    wait_for(lambda: instance.metrics.user_exceptions == 1)
    message = instance.snapshot().latest_user_exceptions[0].exception_string
    assert "state is not configured for function public/default/" in message


@pytest.mark.brokers("lite", "apache")
def test_atmost_once_does_not_redeliver_failures(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    instance = run_function(
        "fragile.py", inputs=[topic], output=f"{topic}-out", processing_guarantees="ATMOST_ONCE"
    )
    produce(client, topic, ["boom", "ok"])
    assert values(collect(client, f"{topic}-out", 1)) == ["OK"]
    time.sleep(0.6)  # past the 200 ms redelivery delay
    assert instance.metrics.received == 2
    assert instance.metrics.user_exceptions == 1


@pytest.mark.brokers("lite", "apache")
def test_manual_ack_leaves_unacked_messages_for_redelivery(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    source = EXAMPLES.parent / "build" / "manual_fn.py"
    source.parent.mkdir(exist_ok=True)
    source.write_text(
        "def process(input, context):\n"
        "    if input.startswith('ack'):\n"
        "        context.ack(context.get_message_id(), context.get_current_message_topic_name())\n"
        "    return input\n"
    )
    name = "manual-fn"
    first = run_function(
        py=str(source),
        name=name,
        inputs=[topic],
        output=f"{topic}-out",
        processing_guarantees="MANUAL",
    )
    produce(client, topic, ["ack-1", "keep-2"])
    assert values(collect(client, f"{topic}-out", 2)) == ["ack-1", "keep-2"]
    first.stop()
    assert first.wait(10)
    second = run_function(
        py=str(source),
        name=name,
        inputs=[topic],
        output=f"{topic}-out2",
        processing_guarantees="MANUAL",
    )
    assert values(collect(client, f"{topic}-out2", 1)) == ["keep-2"]
    assert second.metrics.received == 1


def test_multiple_inputs(client: pulsar.Client, run_function: RunFunction, topic: str) -> None:
    for suffix in ("a", "b"):
        produce(client, f"{topic}-{suffix}", [suffix])
    run_function("exclamation.py", inputs=[f"{topic}-a", f"{topic}-b"], output=f"{topic}-out")
    assert sorted(values(collect(client, f"{topic}-out", 2))) == ["a!", "b!"]


def test_topics_pattern_on_a_broker_that_cannot_list_topics(broker_url: str, topic: str) -> None:
    # pulsar-lite 0.2 has no GetTopicsOfNamespace, which pattern consumers need: the request
    # goes unanswered until the client's operation timeout (shorter than the fixture's 10 s)
    client = pulsar.Client(
        broker_url,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        operation_timeout_seconds=3,
    )
    config = FunctionConfig(
        name=f"fn-{uuid.uuid4().hex[:8]}",
        py=str(EXAMPLES / "exclamation.py"),
        topics_pattern=f"{topic}-p.*",
        output=f"{topic}-pout",
    )
    try:
        with pytest.raises(
            InstanceError,
            match=r"cannot subscribe to topicsPattern .* list the topics in inputs instead",
        ):
            FunctionInstance(config, client, InstanceOptions(retry_delay_ms=200)).start()
    finally:
        client.close()


@pytest.mark.brokers("apache")
def test_topics_pattern_consumes_every_matching_topic(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    for suffix in ("p1", "p2", "other"):
        produce(client, f"{topic}-{suffix}", [suffix])
    run_function("exclamation.py", topics_pattern=f"{topic}-p.*", output=f"{topic}-out")
    out = collect(client, f"{topic}-out", 2)
    assert sorted(values(out)) == ["p1!", "p2!"]
    assert {m.properties()["__pfn_input_topic__"] for m in out} == {
        f"persistent://public/default/{topic}-p1",
        f"persistent://public/default/{topic}-p2",
    }


@pytest.mark.brokers("lite", "apache")
def test_effectively_once_processes_each_input_once_with_retries(
    client: pulsar.Client, run_function: RunFunction, topic: str, tmp_path: Path
) -> None:
    # a module of its own per run: its ``failed`` set must start empty on each broker
    source = tmp_path / f"flaky_once_{uuid.uuid4().hex[:8]}.py"
    source.write_text(
        "failed = set()\n"
        "def process(input):\n"
        "    if input.endswith('7') and input not in failed:\n"
        "        failed.add(input)\n"
        "        raise RuntimeError('transient')\n"
        "    return input\n"
    )
    instance = run_function(
        py=str(source),
        inputs=[topic],
        output=f"{topic}-out",
        processing_guarantees="EFFECTIVELY_ONCE",
    )
    inputs = [f"m{i}" for i in range(30)]
    produce(client, topic, inputs)
    out = collect(client, f"{topic}-out", 30)
    assert values(out) == inputs  # exactly once, and still in order
    assert instance.metrics.user_exceptions == 3
    sequence_ids = [m.properties()["__pfn_input_msg_id__"] for m in out]
    assert len(set(sequence_ids)) == 30


def test_graceful_stop_mid_stream_loses_nothing(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    # A live stream: the first instance stops while messages keep arriving, a second one
    # takes over the subscription. (A stop while holding a large prefetched backlog trips a
    # pulsar-lite 0.2 dispatch bug that stalls the subscription, with plain clients too.)
    inputs = [f"n{i}" for i in range(2000)]
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5)

    def stream() -> None:
        for i, value in enumerate(inputs):
            producer.send_async(value.encode(), None)
            if i % 20 == 0:
                time.sleep(0.01)
        producer.flush()

    streamer = threading.Thread(target=stream)
    first = run_function("exclamation.py", name="graceful", inputs=[topic], output=f"{topic}-out")
    streamer.start()
    wait_for(lambda: first.metrics.processed > 200)
    first.stop(drain=True)
    assert first.wait(20)
    second = run_function("exclamation.py", name="graceful", inputs=[topic], output=f"{topic}-out")
    streamer.join()
    out = values(collect(client, f"{topic}-out", 2000, timeout=30))
    assert set(out) == {f"{v}!" for v in inputs}
    assert 0 < first.metrics.processed < 2000
    wait_for(lambda: first.metrics.processed + second.metrics.processed >= 2000)


_KILLED_INSTANCE = """
import sys, time
from magnetar.client import create_client
from magnetar.instance import FunctionConfig, FunctionInstance
url, name, topic, code = sys.argv[1:]
client = create_client(url)
config = FunctionConfig(name=name, py=code, class_name="exclamation.ExclamationFunction",
    inputs=[topic], output=topic + "-out", retain_ordering=True,
    subscription_position="Earliest")
FunctionInstance(config, client).start()
print("running", flush=True)
time.sleep(600)
"""


@pytest.mark.brokers("lite", "apache")
def test_an_ordered_instance_killed_mid_stream_is_taken_over_and_loses_nothing(
    client: pulsar.Client, broker_url: str, run_function: RunFunction, topic: str
) -> None:
    # kill -9 of a Failover consumer the broker is writing to resets its connection, and
    # pulsar-lite 0.2 then keeps that dead consumer on the subscription; the next instance
    # must still become the active one and get what the dead one left unacknowledged
    inputs = [f"k{i}" for i in range(3000)]
    producer = client.create_producer(topic, batching_enabled=False)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _KILLED_INSTANCE,
            broker_url,
            "ordered",
            topic,
            str(EXAMPLES / "exclamation.py"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )

    def stream() -> None:
        for value in inputs:
            producer.send_async(value.encode(), None)
            time.sleep(0.001)
        producer.flush()

    streamer = threading.Thread(target=stream)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "running"
        streamer.start()
        time.sleep(1.0)  # the child is handed messages when it dies
    finally:
        child.kill()
        child.wait(10)
    streamer.join()
    successor = run_function(
        "exclamation.py",
        name="ordered",
        inputs=[topic],
        output=f"{topic}-out",
        retain_ordering=True,
    )
    wait_for(lambda: successor.metrics.processed > 0, 30)
    outputs = client.subscribe(
        f"{topic}-out", "check", initial_position=pulsar.InitialPosition.Earliest
    )
    seen: set[str] = set()
    expected = {f"{v}!" for v in inputs}
    deadline = time.monotonic() + 60
    while not expected <= seen and time.monotonic() < deadline:
        with contextlib.suppress(pulsar.Timeout):
            message = outputs.receive(1000)
            outputs.acknowledge(message)
            seen.add(message.data().decode())
    outputs.close()
    assert len(expected - seen) == 0, f"{len(expected - seen)} inputs never processed"


def test_missing_code_is_reported_on_start(client: pulsar.Client, topic: str) -> None:
    config = FunctionConfig(name="nocode", inputs=[topic], py=str(EXAMPLES / "nope.py"))
    instance = FunctionInstance(config, client, InstanceOptions())
    with pytest.raises(InstanceError, match=r"function file .*nope\.py does not exist"):
        instance.start()


@pytest.mark.brokers("lite", "apache")
def test_output_too_large_for_the_broker_is_dead_lettered_not_lost(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    source = EXAMPLES.parent / "build" / "inflate_fn.py"
    source.parent.mkdir(exist_ok=True)
    source.write_text(
        "def process(input):\n    return input * 6_000_000 if input == 'x' else input\n"
    )
    instance = run_function(
        py=str(source),
        inputs=[topic],
        output=f"{topic}-out",
        max_message_retries=1,
        dead_letter_topic=f"{topic}-dlq",
    )
    produce(client, topic, ["a", "x", "b"])
    assert sorted(values(collect(client, f"{topic}-out", 2))) == ["a", "b"]
    assert values(collect(client, f"{topic}-dlq", 1, timeout=20)) == ["x"]
    wait_for(lambda: instance.metrics.system_exceptions >= 2)
    assert "MessageTooBig" in instance.snapshot().latest_system_exceptions[0].exception_string


def test_skip_to_latest_skips_what_arrived_before_the_start(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    produce(client, topic, ["old-1", "old-2"])
    run_function(
        "exclamation.py",
        inputs=[topic],
        output=f"{topic}-out",
        skip_to_latest=True,
    )
    produce(client, topic, ["new"])
    assert values(collect(client, f"{topic}-out", 1)) == ["new!"]
