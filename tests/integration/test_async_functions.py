"""``async def process``: invocations run concurrently up to maxPendingAsyncRequests, outputs
keep the input order, failures and timeouts are retried and dead-lettered as for any function."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pulsar

from magnetar.instance import InstanceOptions
from tests.integration.conftest import RunFunction, collect, produce, values, wait_for

_FAST_RETRY = InstanceOptions(retry_delay_ms=100, max_retry_delay_ms=200)

SOURCE = """
import asyncio
import random

from pulsar import Function


class Lookup(Function):
    def __init__(self):
        self.running = 0
        self.most = 0

    async def process(self, input, context):
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(random.uniform(0.01, 0.05))  # a service call
            if input.startswith("bad"):
                raise ValueError("no such item: " + input)
            if input == "slow":
                await asyncio.sleep(10)
            if input.startswith("side"):
                context.publish(context.get_user_config_value("side"), input + "?")
            if input == "stateful":
                context.incr_counter("n", 1)
            return f"{input}:{self.most}"
        finally:
            self.running -= 1


async def process(input):
    await asyncio.sleep(0.01)
    return input.upper()
"""


def function_file(tmp_path: Path) -> str:
    path = tmp_path / "lookup.py"
    path.write_text(textwrap.dedent(SOURCE))
    return str(path)


def test_invocations_overlap_and_outputs_keep_the_input_order(
    client: pulsar.Client, run_function: RunFunction, topic: str, tmp_path: Path
) -> None:
    inputs = [f"m{i}" for i in range(300)]
    produce(client, topic, inputs)
    run_function(
        py=function_file(tmp_path),
        class_name="lookup.Lookup",
        inputs=[topic],
        output=f"{topic}-out",
        max_pending_async_requests=32,
    )
    outputs = values(collect(client, f"{topic}-out", 300, timeout=30))
    assert [value.split(":")[0] for value in outputs] == inputs
    most = max(int(value.split(":")[1]) for value in outputs)
    assert 1 < most <= 32  # concurrent (in flight together), and never more than asked


def test_a_module_level_async_process(
    client: pulsar.Client, run_function: RunFunction, topic: str, tmp_path: Path
) -> None:
    produce(client, topic, ["a", "b"])
    run_function(
        py=function_file(tmp_path), class_name="lookup", inputs=[topic], output=f"{topic}-out"
    )
    assert values(collect(client, f"{topic}-out", 2)) == ["A", "B"]


def test_failures_timeouts_publishes_and_state(
    client: pulsar.Client, run_function: RunFunction, topic: str, tmp_path: Path
) -> None:
    instance = run_function(
        options=_FAST_RETRY,
        py=function_file(tmp_path),
        class_name="lookup.Lookup",
        inputs=[topic],
        output=f"{topic}-out",
        timeout_ms=500,
        max_message_retries=1,
        dead_letter_topic=f"{topic}-dlq",
        user_config={"side": f"{topic}-side"},
    )
    produce(client, topic, ["ok", "bad-1", "slow", "side-1", "stateful", "done"])
    assert sorted(values(collect(client, f"{topic}-dlq", 3, timeout=30))) == [
        "bad-1",
        "slow",
        "stateful",
    ]
    assert [v.split(":")[0] for v in values(collect(client, f"{topic}-out", 3))] == [
        "ok",
        "side-1",
        "done",
    ]
    assert values(collect(client, f"{topic}-side", 1)) == ["side-1?"]
    wait_for(lambda: instance.metrics.user_exceptions == 6)
    errors = [e.exception_string for e in instance.snapshot().latest_user_exceptions]
    assert any("longer than its timeout of 500 ms" in e for e in errors)
    assert any("state is not available to an async process" in e for e in errors)


def test_an_ordered_subscription_keeps_order_across_a_retry(
    client: pulsar.Client, run_function: RunFunction, topic: str, tmp_path: Path
) -> None:
    inputs = [f"m{i}" for i in range(60)]
    inputs[20] = "bad-x"
    produce(client, topic, inputs)
    run_function(
        options=_FAST_RETRY,
        py=function_file(tmp_path),
        class_name="lookup.Lookup",
        inputs=[topic],
        output=f"{topic}-out",
        retain_ordering=True,
        max_message_retries=2,
        dead_letter_topic=f"{topic}-dlq",
    )
    assert values(collect(client, f"{topic}-dlq", 1, timeout=20)) == ["bad-x"]
    outputs = [v.split(":")[0] for v in values(collect(client, f"{topic}-out", 59, timeout=30))]
    assert outputs == [v for v in inputs if v != "bad-x"]
