"""When outputs go out: at once when no more input is waiting (a light stream does not wait
for the batch's publish delay), and as the user's ``batchingConfig`` says when one is given."""

from __future__ import annotations

import pulsar

from magnetar.instance import InstanceOptions
from tests.integration.conftest import RunFunction, collect, produce, values

EXCLAMATION = {"example": "exclamation.py", "class_name": "exclamation.ExclamationFunction"}
TEN_MINUTES_MS = 600_000


def test_a_light_streams_output_does_not_wait_for_the_publish_delay(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    # a publish delay far longer than the wait for the output: only an early send passes
    options = InstanceOptions(batching_max_publish_delay_ms=TEN_MINUTES_MS)
    run_function(**EXCLAMATION, options=options, inputs=[topic], output=f"{topic}-out")
    produce(client, topic, ["one"])
    assert values(collect(client, f"{topic}-out", 1, timeout=10)) == ["one!"]
    produce(client, topic, ["two", "three"])
    later = collect(client, f"{topic}-out", 3, timeout=10, subscription="later")
    assert values(later) == ["one!", "two!", "three!"]


def test_the_users_batching_config_holds_batches_as_asked(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    batching = {"batchingMaxPublishDelayMs": TEN_MINUTES_MS, "batchingMaxMessages": 3}
    instance = run_function(
        **EXCLAMATION,
        inputs=[topic],
        output=f"{topic}-out",
        producer_config={"batchingConfig": batching},
    )
    produce(client, topic, ["a", "b", "c", "d"])
    # three fill a batch, which goes out; the fourth waits for its (ten-minute) delay
    batch = collect(client, f"{topic}-out", 3, timeout=10, subscription="first")
    assert values(batch) == ["a!", "b!", "c!"]
    assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in batch}) == 1
    instance.stop()  # a graceful stop sends what is still batched
    assert instance.wait(30)
    assert values(collect(client, f"{topic}-out", 4, subscription="after-stop"))[-1] == "d!"
