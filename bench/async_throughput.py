"""Async functions: an ``async def process`` that awaits 10 ms per message (a service call),
one invocation at a time (maxPendingAsyncRequests 1) vs 64 in flight, in the same run.

The target (issue 17) is a ratio of at least 50. Rates are timed from the first message
received: one at a time takes 20 s for 2,000 messages, and the subscribe second would otherwise
weigh 50 times more on the concurrent side. Each side runs ``--repeat`` times,
alternating, unpinned and pinned to one core (``taskset -c 1``); the JSON holds every rate, the
medians and the ratio of medians.

    python bench/async_throughput.py [--messages 2000] [--repeat 3] [--broker-url URL]
"""

from __future__ import annotations

import sys
import uuid

import pulsar
from _throughput import ROOT, compare, run_until_processed

from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions


def _side(pending: int) -> object:
    def run(client: pulsar.Client, source: str, sink: str, count: int) -> float:
        config = FunctionConfig(
            name=f"bench-{uuid.uuid4().hex[:6]}",
            py=str(ROOT / "examples" / "async_lookup.py"),
            class_name="async_lookup.AsyncLookup",
            inputs=[source],
            output=sink,
            subscription_position="Earliest",
            max_pending_async_requests=pending,
        )
        instance = FunctionInstance(config, client, InstanceOptions())
        return run_until_processed(instance, count, from_first_message=True)

    return run


if __name__ == "__main__":
    if "--messages" not in sys.argv:  # 10 ms a message one at a time: keep the default short
        sys.argv += ["--messages", "2000"]
    compare(
        __doc__ or "",
        "async_throughput",
        ("one_at_a_time", _side(1)),  # type: ignore[arg-type]
        ("pending_64", _side(64)),  # type: ignore[arg-type]
    )
