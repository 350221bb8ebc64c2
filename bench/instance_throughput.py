"""Instance throughput: the exclamation function through a Magnetar instance vs a plain
pulsar-client loop, end to end, in the same run.

Both read the same number of 100-byte messages from a topic of their own, produce the
results (async, batched) and acknowledge each input after its output is persisted (the
plain loop in each send's callback, as an ATLEAST_ONCE user would write it). Each side runs
``--repeat`` times, alternating, unpinned and pinned to one core (``taskset -c 1``), on the
embedded pulsar-lite and on Apache Pulsar standalone, one after the other; the JSON holds every
rate, the medians, the ratio of medians and each side's Apache / pulsar-lite ratio.

    python bench/instance_throughput.py [--messages 100000] [--repeat 3]
                                        [--broker lite|apache|both] [--broker-url URL]
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pulsar
from _throughput import ROOT, compare, run_until_processed

from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions


def plain_loop(client: pulsar.Client, source: str, sink: str, count: int) -> float:
    consumer = client.subscribe(
        source,
        "plain",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = client.create_producer(
        sink,
        batching_enabled=True,
        batching_max_publish_delay_ms=10,
        block_if_queue_full=True,
        max_pending_messages=40_000,
    )
    started = time.perf_counter()
    for _ in range(count):
        message = consumer.receive()

        def acknowledge(result: Any, message_id: Any, message: Any = message) -> None:
            consumer.acknowledge(message)

        producer.send_async(message.data() + b"!", acknowledge)
    producer.flush()
    elapsed = time.perf_counter() - started
    consumer.close()
    producer.close()
    return count / elapsed


def magnetar_instance(client: pulsar.Client, source: str, sink: str, count: int) -> float:
    config = FunctionConfig(
        name=f"bench-{uuid.uuid4().hex[:6]}",
        py=str(ROOT / "examples" / "exclamation.py"),
        class_name="exclamation.ExclamationFunction",
        inputs=[source],
        output=sink,
        subscription_position="Earliest",
    )
    # includes subscribing: a few ms against the plain loop
    return run_until_processed(FunctionInstance(config, client, InstanceOptions()), count)


if __name__ == "__main__":
    compare(
        __doc__ or "",
        "instance_throughput",
        ("plain", plain_loop),
        ("magnetar", magnetar_instance),
        brokers="both",
    )
