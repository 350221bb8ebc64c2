"""Instances sharing a subscription on pulsar-lite send their acknowledgements at once: one
acknowledged and then killed does not leave its messages to be handed out again."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pulsar
import pytest

from tests.integration.conftest import produce

pytestmark = pytest.mark.brokers("lite", "apache")

# Subscribes as an instance of a function of parallelism 3 (its inputs acknowledge at once),
# takes the backlog, acknowledges all of it and dies 50 ms later without closing anything:
# pulsar-client would have sent grouped acknowledgements 100 ms after subscribing.
KILLED_AFTER_ACKNOWLEDGING = textwrap.dedent(
    """
    import os, sys, threading, time
    import pulsar
    from magnetar.instance import FunctionConfig, InstanceOptions
    from magnetar.instance.inputs import Inputs
    from magnetar.instance.retries import Ordering, RetryQueue

    url, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    config = FunctionConfig(
        name="acks", py="f.py", inputs=[topic], parallelism=3, subscription_position="Earliest"
    )
    options = InstanceOptions(shared_acks_cost_gaps=True)
    retries = RetryQueue(Ordering.NONE, None, 1, 1)
    inputs = Inputs(client, config, options, retries, threading.Event())
    inputs.subscribe()
    taken = []
    deadline = time.monotonic() + 20
    while len(taken) < count and time.monotonic() < deadline:
        taken += inputs.receive(waiting_for_sends=False)
    for consumer, message in taken:
        inputs.ack(message.message_id(), message.topic_name())
    time.sleep(0.05)
    print(len(taken), flush=True)
    os._exit(0)
    """
)


def test_what_a_sharing_instance_acknowledged_is_not_handed_out_again_after_it_dies(
    client: pulsar.Client, broker_url: str, topic: str
) -> None:
    produce(client, topic, [f"m{i}" for i in range(5)])
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_ACKNOWLEDGING, broker_url, topic, "5"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert killed.stdout.strip() == "5", killed.stderr
    after = client.subscribe(topic, "public/default/acks", consumer_type=pulsar.ConsumerType.Shared)
    try:
        with pytest.raises(pulsar.Timeout):
            message = after.receive(3000)
            pytest.fail(f"{message.data()!r} was handed out again")
    finally:
        after.close()
