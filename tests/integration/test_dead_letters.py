"""Retries and the dead-letter topic under redeliveries that are not failures: the DLQ holds
exactly the inputs the function failed on, whatever the broker delivers again (batch-mates
of a failing message, a consumer closed with messages in flight, a Failover take-over)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pulsar

from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions
from tests.integration.conftest import RunFunction, collect, values, wait_for

_RETRY_FAST = InstanceOptions(retry_delay_ms=100, max_retry_delay_ms=400)


def produce_batched(client: pulsar.Client, topic: str, inputs: list[str]) -> None:
    """Send ``inputs`` in broker batches, so a failing input has batch-mates."""
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_publish_delay_ms=20
    )
    for value in inputs:
        producer.send_async(value.encode(), None)
    producer.flush()
    producer.close()


def drain(client: pulsar.Client, topic: str, quiet_s: float = 3.0) -> list[Any]:
    """Every message on ``topic`` so far: read until nothing arrives for ``quiet_s``."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    messages = []
    try:
        while True:
            try:
                messages.append(reader.read_next(int(quiet_s * 1000)))
            except pulsar.Timeout:
                return messages
    finally:
        reader.close()


def failing_python(tmp_path: Path) -> str:
    source = tmp_path / "refuses_bad.py"
    source.write_text(
        textwrap.dedent(
            """
            def process(input):
                if input.startswith("bad"):
                    raise ValueError(f"cannot take {input}")
                return input + "!"
            """
        )
    )
    return str(source)


def test_python_dead_letters_exactly_the_failed_inputs_across_redeliveries(
    client: pulsar.Client, run_function: RunFunction, topic: str, tmp_path: Path
) -> None:
    fields: dict[str, Any] = {
        "py": failing_python(tmp_path),
        "name": f"picky-{topic}",
        "inputs": [topic],
        "output": f"{topic}-out",
        "max_message_retries": 2,
        "dead_letter_topic": f"{topic}-dlq",
    }
    first = run_function(options=_RETRY_FAST, **fields)
    second = run_function(options=_RETRY_FAST, **fields)
    inputs = [f"bad-{i}" if i in (7, 1582, 1583) else f"m{i}" for i in range(2000)]
    produce_batched(client, topic, inputs[:1000])
    wait_for(lambda: first.metrics.processed + second.metrics.processed >= 500, 30)
    # a consumer closed with messages in flight: the broker delivers them again, to the other
    first.stop(drain=False)
    assert first.wait(30)
    run_function(options=_RETRY_FAST, **fields)
    produce_batched(client, topic, inputs[1000:])

    dead = drain(client, f"{topic}-dlq")
    outputs = set(values(drain(client, f"{topic}-out")))
    assert sorted(values(dead)) == ["bad-1582", "bad-1583", "bad-7"]
    assert outputs == {f"{v}!" for v in inputs if not v.startswith("bad")}
    letter = next(m for m in dead if m.data() == b"bad-7")
    assert letter.properties()["REAL_TOPIC"] == f"persistent://public/default/{topic}"
    assert letter.properties()["ORIGIN_MESSAGE_ID"].count(":") >= 2


def test_python_failures_are_retried_with_backoff_and_logged_once(
    client: pulsar.Client, run_function: RunFunction, topic: str, tmp_path: Path
) -> None:
    instance = run_function(
        options=_RETRY_FAST,
        py=failing_python(tmp_path),
        inputs=[topic],
        output=f"{topic}-out",
        max_message_retries=3,
        dead_letter_topic=f"{topic}-dlq",
        log_topic=f"{topic}-log",
    )
    produce_batched(client, topic, ["a", "bad", "b"])
    assert values(collect(client, f"{topic}-dlq", 1, timeout=20)) == ["bad"]
    assert sorted(values(collect(client, f"{topic}-out", 2))) == ["a!", "b!"]
    status = instance.snapshot().status()["status"]
    assert status["numUserExceptions"] == 4  # the first attempt and three retries
    assert status["numDeadLettered"] == 1
    logs = values(drain(client, f"{topic}-log", quiet_s=1.5))
    assert sum("Traceback" in line for line in logs) == 1
    assert sum("failed again" in line for line in logs) == 2
    assert any("went to the dead-letter topic" in line for line in logs)


def test_javascript_failures_fail_alone_in_their_chunk(
    client: pulsar.Client, run_function: RunFunction, topic: str, tmp_path: Path
) -> None:
    script = tmp_path / "picky.js"
    script.write_text(
        textwrap.dedent(
            """
            function process(input) {
              if (input === "throws") throw new Error("no");
              if (input === "loops") { while (true) {} }
              return input + "!";
            }
            """
        )
    )
    inputs = [f"m{i}" for i in range(600)]
    inputs[100], inputs[400] = "throws", "loops"
    produce_batched(client, topic, inputs)
    instance = run_function(
        options=_RETRY_FAST,
        js=str(script),
        inputs=[topic],
        output=f"{topic}-out",
        timeout_ms=300,
        max_message_retries=1,
        dead_letter_topic=f"{topic}-dlq",
    )
    dead = drain(client, f"{topic}-dlq")
    outputs = values(drain(client, f"{topic}-out"))
    assert sorted(values(dead)) == ["loops", "throws"]
    assert sorted(outputs) == sorted(f"{v}!" for v in inputs if v not in ("throws", "loops"))
    status = instance.snapshot().status()["status"]
    assert status["numUserExceptions"] == 4
    assert status["numDeadLettered"] == 2


def test_ordered_retries_keep_order_through_a_take_over(
    client: pulsar.Client, topic: str, tmp_path: Path
) -> None:
    config = FunctionConfig(
        name=f"ordered-{topic}",
        py=failing_python(tmp_path),
        inputs=[topic],
        output=f"{topic}-out",
        retain_ordering=True,
        subscription_position="Earliest",
        max_message_retries=2,
        dead_letter_topic=f"{topic}-dlq",
    )
    inputs = [f"m{i}" for i in range(300)]
    inputs[150] = "bad"
    produce_batched(client, topic, inputs)
    first = FunctionInstance(config, client, _RETRY_FAST).start()
    wait_for(lambda: first.metrics.processed >= 50, 30)
    # the successor takes the Failover subscription over, which rewinds it
    second = FunctionInstance(config, client, _RETRY_FAST).start()
    first.stop(drain=False)
    try:
        dead = collect(client, f"{topic}-dlq", 1, timeout=30)
        outputs = values(drain(client, f"{topic}-out"))
    finally:
        second.stop()
        assert first.wait(30) and second.wait(30)
    assert values(dead) == ["bad"]
    first_seen: dict[str, int] = {}
    for index, value in enumerate(outputs):
        first_seen.setdefault(value, index)
    good = [f"{v}!" for v in inputs if v != "bad"]
    assert sorted(first_seen, key=first_seen.__getitem__) == good  # in input order
