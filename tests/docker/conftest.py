"""``docker compose`` with the repository's docker-compose.yml, on a machine with a Docker engine.

Every test here is skipped, with the reason, when no Docker engine answers a ping, so
``make test`` passes on a machine without Docker; ``make test-docker`` sets
``MAGNETAR_REQUIRE_DOCKER=1``, which turns that skip into a failure. (The Apache Pulsar suites
themselves run on the standalone Maven fetched; ``make test-docker`` also runs them against
the ``apachepulsar/pulsar`` image: see ``tests/docker/container.py``.)
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import pulsar
import pytest

from tests.docker.container import docker_problem


def require(problem: str | None) -> None:
    """Skip (or, under ``make test-docker``, fail) the test when ``problem`` is not None."""
    if problem is None:
        return
    if os.environ.get("MAGNETAR_REQUIRE_DOCKER"):
        pytest.fail(f"make test-docker: {problem}", pytrace=False)
    pytest.skip(f"Docker suite skipped: {problem}; run `make test-docker` where Docker runs")


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """A Docker engine that answers; otherwise every test here is skipped with the reason."""
    require(docker_problem())


@pytest.fixture(autouse=True)
def _needs_docker(docker_engine: None) -> None:
    """Every test in this directory needs the engine."""


def produce(client: pulsar.Client, topic: str, values: list[str]) -> None:
    """Send ``values`` unbatched and wait until all are persisted."""
    producer = client.create_producer(
        f"persistent://public/default/{topic}", batching_enabled=False
    )
    try:
        for value in values:
            producer.send(value.encode())
    finally:
        producer.close()


def consume(
    client: pulsar.Client, topic: str, until: Callable[[list[Any]], bool], timeout: float = 60.0
) -> list[Any]:
    """Messages of ``topic`` from its start until ``until(messages)`` holds or the timeout."""
    consumer = client.subscribe(
        f"persistent://public/default/{topic}",
        f"test-{uuid.uuid4().hex[:8]}",
        initial_position=pulsar.InitialPosition.Earliest,
    )
    messages: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while not until(messages) and time.monotonic() < deadline:
            try:
                message = consumer.receive(500)
            except pulsar.Timeout:
                continue
            consumer.acknowledge(message)
            messages.append(message)
    finally:
        consumer.close()
    return messages


def texts(messages: list[Any]) -> list[str]:
    return [message.data().decode() for message in messages]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)
