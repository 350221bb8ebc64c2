"""An instance's inputs against the real broker: what reaches user code, and how often."""

from __future__ import annotations

import threading
import time

import pulsar
import pytest

from magnetar.instance import FunctionConfig, InstanceOptions
from magnetar.instance.inputs import Inputs
from magnetar.instance.retries import Ordering, RetryQueue
from tests.conftest import EXAMPLES
from tests.integration.conftest import produce


def ordered_inputs(client: pulsar.Client, topic: str) -> Inputs:
    config = FunctionConfig(
        name="repeats",
        py=str(EXAMPLES / "exclamation.py"),
        inputs=[topic],
        retain_ordering=True,
        subscription_position="Earliest",
    )
    inputs = Inputs(
        client, config, InstanceOptions(), RetryQueue(Ordering.ALL, None, 1, 1), threading.Event()
    )
    inputs.subscribe()
    return inputs


def received_until(inputs: Inputs, last: str, seconds: float = 10.0) -> list[str]:
    """What ``inputs`` hands over until ``last`` comes (or ``seconds`` pass)."""
    got: list[str] = []
    deadline = time.monotonic() + seconds
    while last not in got and time.monotonic() < deadline:
        got += [m.data().decode() for _, m in inputs.receive(waiting_for_sends=False)]
    return got


# Apache only: pulsar-lite ignores a redelivery request on a Failover subscription (its copies
# come from a reset connection, which a test cannot cause on demand).
@pytest.mark.brokers("apache")
def test_an_ordered_subscription_hands_over_a_message_delivered_again_only_once(
    client: pulsar.Client, topic: str
) -> None:
    inputs = ordered_inputs(client, topic)
    try:
        produce(client, topic, ["a", "b", "c"])
        assert received_until(inputs, "c") == ["a", "b", "c"]
        # what a reset connection does: the broker sends every unacknowledged message again
        inputs.consumers[0].redeliver_unacknowledged_messages()
        produce(client, topic, ["d"])
        assert received_until(inputs, "d") == ["d"]
        # a rewind (after a failed send) subscribes again: all of it is new again
        inputs.rewind(0)
        assert received_until(inputs, "d") == ["a", "b", "c", "d"]
    finally:
        inputs.close()


def test_a_message_that_ends_a_wait_goes_out_before_the_next_is_looked_for(
    client: pulsar.Client, topic: str
) -> None:
    """On a light stream each message comes after a wait, with nothing behind it: it is taken
    alone, and the next receive flushes its output before anything else (no empty poll
    first, each one the client's exception, on every message's path)."""
    inputs = ordered_inputs(client, topic)
    flushes: list[int] = []

    def receive() -> list[str]:
        got = inputs.receive(waiting_for_sends=False, idle=lambda: flushes.append(1))
        return [message.data().decode() for _, message in got]

    try:
        threading.Timer(0.05, produce, (client, topic, ["a"])).start()
        got: list[str] = []
        while not got:  # each wait is at most the poll interval
            got = receive()
        assert got == ["a"]
        produce(client, topic, ["b", "c"])
        time.sleep(0.3)  # both are in the consumer's queue now
        flushes.clear()
        got = receive()
        # flushed first, though "b" was ready (before, the poll found it and nothing went out)
        assert len(flushes) == 1 and got[0] == "b"
        assert got + ([] if got[-1] == "c" else received_until(inputs, "c")) == ["b", "c"]
    finally:
        inputs.close()
