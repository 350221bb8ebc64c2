"""When outputs go out: at once when no more input is waiting (a light stream does not wait
for the batch's publish delay), within a millisecond or so while input keeps coming, and as
the user's ``batchingConfig`` says when one is given."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pulsar

from magnetar.instance import InstanceOptions
from tests.integration.conftest import RunFunction, collect, produce, python_file, values

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


def test_user_code_runs_on_a_thread_whose_timed_waits_end_on_time(
    client: pulsar.Client, run_function: RunFunction, topic: str, tmp_path: Path
) -> None:
    # Linux's default timer slack (50 us) stretched each empty poll of the inputs to 100 us
    code = python_file(
        tmp_path,
        "timer_slack.py",
        """
        import ctypes

        def process(input):
            return str(ctypes.CDLL(None).prctl(30, 0, 0, 0, 0))  # PR_GET_TIMERSLACK
        """,
    )
    run_function(py=code, inputs=[topic], output=f"{topic}-out")
    produce(client, topic, ["slack?"])
    assert values(collect(client, f"{topic}-out", 1, timeout=10)) == ["1"]


def test_outputs_go_out_while_input_keeps_coming_faster_than_it_is_processed(
    client: pulsar.Client, run_function: RunFunction, topic: str, tmp_path: Path
) -> None:
    code = python_file(
        tmp_path,
        "slow_echo.py",
        """
        import time

        def process(input):
            time.sleep(0.01)
            return input
        """,
    )
    options = InstanceOptions(batching_max_publish_delay_ms=TEN_MINUTES_MS)
    run_function(py=code, options=options, inputs=[topic], output=f"{topic}-out")
    streaming = threading.Event()
    streaming.set()

    def stream() -> None:  # 500 a second against 100 processed: input is always waiting
        producer = client.create_producer(topic, batching_enabled=False)
        sent = 0
        while streaming.is_set() and sent < 5000:
            producer.send_async(f"m{sent}".encode(), None)
            sent += 1
            time.sleep(0.002)
        producer.flush()
        producer.close()

    sender = threading.Thread(target=stream)
    sender.start()
    try:
        started = time.monotonic()
        first = collect(client, f"{topic}-out", 5, timeout=3)
        assert values(first)[:5] == ["m0", "m1", "m2", "m3", "m4"]
        assert streaming.is_set() and time.monotonic() - started < 3
    finally:
        streaming.clear()
        sender.join()


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
