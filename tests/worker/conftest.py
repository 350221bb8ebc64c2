"""Fixtures for the worker's runtime tests: instance specs and started runtime managers."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.instance import FunctionConfig
from magnetar.worker.runtime import InstanceSpec, ProcessRuntime, Runtime
from magnetar.worker.runtime_manager import RuntimeManager
from tests.conftest import EXAMPLES

WORKER_ID = "test-worker"

StartManager = Callable[..., RuntimeManager]


def function_config(example: str | None = None, **fields: Any) -> FunctionConfig:
    """A FunctionConfig (unique name, Earliest position); ``example`` names a file in examples/."""
    fields.setdefault("name", f"fn-{uuid.uuid4().hex[:8]}")
    fields.setdefault("subscription_position", "Earliest")
    if example:
        fields.setdefault("py", str(EXAMPLES / example))
    return FunctionConfig(**fields)


def instance_specs(config: FunctionConfig, version: int = 1) -> dict[str, InstanceSpec]:
    """The specs of every instance of ``config``, by instance key (what ``apply`` takes)."""
    specs = [InstanceSpec(config.fqfn, i, config, version) for i in range(config.parallelism)]
    return {spec.key: spec for spec in specs}


@pytest.fixture
def start_manager(broker_url: str) -> Iterator[StartManager]:
    """Start a RuntimeManager (process runtime unless ``runtime`` is given); stopped with
    drain at teardown, which must leave nothing running."""
    started: list[RuntimeManager] = []

    def start(runtime: Runtime | None = None, **kwargs: Any) -> RuntimeManager:
        manager = RuntimeManager(
            runtime or ProcessRuntime(broker_url, WORKER_ID), WORKER_ID, **kwargs
        )
        started.append(manager.start())
        return manager

    yield start
    for manager in started:
        manager.stop(drain=True)
    for manager in started:
        assert manager.wait(30), "the runtime manager did not stop within 30 s"


def pid_exists(pid: int) -> bool:
    """Whether a process with this pid is running (an exited one, reaped or not, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        # an orphan's zombie lingers until init reaps it; the state follows the "(name)"
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return stat.parent.exists()


def receive_until(
    client: pulsar.Client,
    topic: str,
    expected: set[str],
    timeout: float = 15.0,
    subscription: str = "test-reader",
) -> list[str]:
    """Values from ``topic`` (acknowledged) until all of ``expected`` arrived or the timeout;
    duplicates (an at-least-once redelivery) are kept, so callers can check for losses."""
    consumer = client.subscribe(
        topic, subscription, initial_position=pulsar.InitialPosition.Earliest
    )
    received: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while not expected <= set(received):
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                break
            try:
                message = consumer.receive(remaining_ms)
            except pulsar.Timeout:
                break
            consumer.acknowledge(message)
            received.append(message.data().decode())
    finally:
        consumer.close()
    return received
