"""What an instance takes from its inputs: an instance that stops taking holds few messages of
a shared subscription's backlog where it may (the others get the rest), and a window full of
retries waits for the first one to be due instead of spinning."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pulsar
import pytest

from magnetar.instance import FunctionConfig, InstanceOptions
from magnetar.instance.config import ConsumerSpec
from magnetar.instance.inputs import Inputs
from magnetar.instance.retries import Ordering, RetryQueue
from magnetar.instance.subscription import SHARED_ON_GAPPED_CURSOR
from tests.conftest import EXAMPLES
from tests.integration.conftest import RunFunction, produce

pytestmark = pytest.mark.brokers("lite", "apache")

BACKLOG = 300


def left_to_others(
    client: pulsar.Client, topic: str, config: FunctionConfig, options: InstanceOptions
) -> int:
    """How many of a backlog another consumer of the subscription gets while an instance's
    inputs take one chunk and then nothing more (its function is stuck)."""
    other = client.subscribe(
        topic, config.subscription_name, consumer_type=pulsar.ConsumerType.Shared
    )
    inputs = Inputs(
        client, config, options, RetryQueue(Ordering.NONE, None, 1, 1), threading.Event()
    )
    inputs.subscribe()
    try:
        produce(client, topic, [f"m{i}" for i in range(BACKLOG)])
        taken = inputs.receive(waiting_for_sends=False)
        assert taken, "the instance took nothing"
        got = 0
        try:
            while True:
                other.acknowledge(other.receive(2000))
                got += 1
        except pulsar.Timeout:
            return got
    finally:
        inputs.close()
        other.close()


def test_instances_sharing_a_subscription_on_pulsar_lite_leave_the_backlog_to_the_others(
    client: pulsar.Client, topic: str
) -> None:
    config = FunctionConfig(
        name="stuck", py=str(EXAMPLES / "exclamation.py"), inputs=[topic], parallelism=3
    )
    held = BACKLOG - left_to_others(
        client, topic, config, InstanceOptions(shared_acks_cost_gaps=True)
    )
    # the chunk it took, and its queue refilled once
    assert 0 < held <= 3 * SHARED_ON_GAPPED_CURSOR


def test_an_input_spec_receiver_queue_size_is_what_a_consumer_prefetches(
    client: pulsar.Client, topic: str
) -> None:
    config = FunctionConfig(
        name="stuck",
        py=str(EXAMPLES / "exclamation.py"),
        inputs=[topic],
        input_specs={topic: ConsumerSpec(receiver_queue_size=10)},
    )
    held = BACKLOG - left_to_others(client, topic, config, InstanceOptions())
    assert 0 < held <= 3 * 10


def test_a_window_full_of_retries_waits_for_them_without_spinning(
    run_function: RunFunction, client: pulsar.Client, topic: str, tmp_path: Path
) -> None:
    code = tmp_path / "fails.py"
    code.write_text("def process(input):\n    raise ValueError('not today')\n")
    instance = run_function(
        py=str(code),
        inputs=[topic],
        options=InstanceOptions(retry_delay_ms=5000, max_unacked=5),
    )
    produce(client, topic, [f"m{i}" for i in range(10)])
    deadline = time.monotonic() + 20
    while instance.snapshot().user_exceptions < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    failed = instance.snapshot().user_exceptions
    assert failed >= 5  # the window (and the rest of the chunk that filled it) held for a retry
    cpu_before, wall_before = time.process_time(), time.monotonic()
    time.sleep(2)
    cpu_s = time.process_time() - cpu_before
    # spinning took a whole core (2 s of CPU here); waiting takes a few milliseconds
    assert cpu_s < 0.5 * (time.monotonic() - wall_before), f"{cpu_s:.2f} s of CPU in 2 s"
    assert instance.snapshot().user_exceptions == failed
