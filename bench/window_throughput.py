"""Window throughput: a count window of 100 (tumbling) over the inputs, through a Magnetar
instance with its state store (the windows' checkpoints), vs the exclamation function through
an instance, in the same run (target: the window at >= 0.5 of the exclamation's rate).

Both read the same number of 100-byte messages from a topic of their own; the exclamation
publishes one output per input, the window one per 100 inputs, acknowledging each input once
its window's output and checkpoint are persisted. Each side runs ``--repeat`` times,
alternating, unpinned and pinned to one core (``taskset -c 1``); the JSON holds every rate,
the medians and the ratio of medians.

    python bench/window_throughput.py [--messages 100000] [--repeat 3] [--broker-url URL]
"""

from __future__ import annotations

import shutil
import tempfile
import uuid

import pulsar
from _throughput import ROOT, compare, run_until_processed
from instance_throughput import magnetar_instance as exclamation

from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions
from magnetar.statestore import JournaledStateStore, StateOptions

WINDOW = 100


def count_window(client: pulsar.Client, source: str, sink: str, count: int) -> float:
    config = FunctionConfig(
        name=f"bench-window-{uuid.uuid4().hex[:6]}",
        py=str(ROOT / "examples" / "window_count.py"),
        inputs=[source],
        output=sink,
        subscription_position="Earliest",
        window_config={"windowLengthCount": WINDOW},
    )
    directory = tempfile.mkdtemp(prefix="magnetar-bench-state-")
    state = JournaledStateStore(client, config.fqfn, StateOptions(directory))
    try:
        instance = FunctionInstance(config, client, InstanceOptions(), state=state)
        return run_until_processed(instance, count)
    finally:
        state.close()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    compare(
        __doc__ or "",
        "window_throughput",
        ("exclamation", exclamation),
        ("window", count_window),
    )
