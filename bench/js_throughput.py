"""JavaScript throughput: the exclamation function in JavaScript (examples/exclamation.js, on
V8) against the same function in Python (examples/exclamation.py), through a Magnetar instance,
end to end, in the same run on the same broker.

Both sides read the same number of 100-byte messages from a topic of their own, produce the
results and acknowledge each input once its output is persisted (ATLEAST_ONCE). Each side runs
``--repeat`` times, alternating, unpinned and pinned to one core (``taskset -c 1``); the JSON
holds every rate, the medians and the ratio of medians (JavaScript / Python).

    python bench/js_throughput.py [--messages 100000] [--repeat 3] [--broker-url URL]
"""

from __future__ import annotations

import uuid
from typing import Any

import pulsar
from _throughput import ROOT, compare, run_until_processed

from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions

CODE: dict[str, dict[str, Any]] = {
    "python": {
        "py": str(ROOT / "examples" / "exclamation.py"),
        "class_name": "exclamation.ExclamationFunction",
    },
    "javascript": {"js": str(ROOT / "examples" / "exclamation.js")},
}


def side(language: str) -> Any:
    def run(client: pulsar.Client, source: str, sink: str, count: int) -> float:
        config = FunctionConfig(
            name=f"bench-{language}-{uuid.uuid4().hex[:6]}",
            inputs=[source],
            output=sink,
            subscription_position="Earliest",
            **CODE[language],
        )
        # includes subscribing (and, for JavaScript, starting V8)
        return run_until_processed(FunctionInstance(config, client, InstanceOptions()), count)

    return run


if __name__ == "__main__":
    compare(
        __doc__ or "",
        "js_throughput",
        ("python", side("python")),
        ("javascript", side("javascript")),
    )
