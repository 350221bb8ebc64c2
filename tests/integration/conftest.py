"""Fixtures for running function instances against the session broker."""

from __future__ import annotations

import textwrap
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions
from tests.conftest import EXAMPLES

RunFunction = Callable[..., FunctionInstance]


@pytest.fixture
def run_function(client: pulsar.Client) -> Iterator[RunFunction]:
    """Start a FunctionInstance from FunctionConfig fields; stopped (drained) at teardown.

    ``example`` names a file in examples/; the subscription starts at Earliest unless given.
    """
    started: list[FunctionInstance] = []

    def start(
        example: str | None = None, options: InstanceOptions | None = None, **fields: Any
    ) -> FunctionInstance:
        fields.setdefault("name", f"fn-{uuid.uuid4().hex[:8]}")
        fields.setdefault("subscription_position", "Earliest")
        if example:
            fields.setdefault("py", str(EXAMPLES / example))
        instance = FunctionInstance(
            FunctionConfig(**fields),
            client,
            options or InstanceOptions(retry_delay_ms=200),
        )
        started.append(instance.start())
        return instance

    yield start
    for instance in started:
        instance.stop()
    for instance in started:
        assert instance.wait(30), "instance did not stop within 30 s"


def produce(
    client: pulsar.Client, topic: str, values: Sequence[str | bytes], **kwargs: Any
) -> None:
    producer = client.create_producer(topic)
    for value in values:
        producer.send(value.encode() if isinstance(value, str) else value, **kwargs)
    producer.close()


def collect(
    client: pulsar.Client,
    topic: str,
    count: int,
    timeout: float = 15.0,
    subscription: str = "test-reader",
) -> list[Any]:
    """Exactly ``count`` messages from ``topic`` (from the earliest), then checks no more come.

    A message id delivered again is dropped: pulsar-lite dispatches a message twice (same id,
    redelivery count 0) when a publish and the consumer's flow dispatch at once. An output
    sent twice has two ids and is kept."""
    consumer = client.subscribe(
        topic, subscription, initial_position=pulsar.InitialPosition.Earliest
    )
    messages: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(messages) <= count:
            # once all are in, a short wait for one too many
            left_ms = int((deadline - time.monotonic()) * 1000)
            wait_ms = left_ms if len(messages) < count else 300
            if wait_ms <= 0:
                break
            try:
                message = consumer.receive(wait_ms)
            except pulsar.Timeout:
                break
            consumer.acknowledge(message)
            messages.setdefault(str(message.message_id()), message)
    finally:
        consumer.close()
    return list(messages.values())


def python_file(directory: Path, name: str, source: str) -> str:
    """``source`` (indented as in the test) written to ``directory/name``; its path."""
    path = directory / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def values(messages: list[Any]) -> list[str]:
    return [m.data().decode() for m in messages]


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout:.0f} s")
        time.sleep(0.05)
