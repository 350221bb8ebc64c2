"""Window functions against the real broker, with a real state store: each kind of window with
its exact outputs, the window's records in the context, late data, failing windows, and
restarts that neither lose an input nor fire a window twice."""

from __future__ import annotations

import base64
import itertools
import json
import os
import signal
import subprocess
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions
from magnetar.instance.windowing.checkpoint import Checkpoint, DoneRuns, checkpoint_key
from magnetar.positions import position
from magnetar.statestore import JournaledStateStore, StateOptions, StateQueryService
from tests.conftest import MAGNETAR, instance_pids
from tests.integration.conftest import collect, produce, values, wait_for

OPTIONS = InstanceOptions(retry_delay_ms=100, metrics_interval_s=0.2)


@pytest.fixture
def code(tmp_path: Path) -> Callable[[str], str]:
    """Write a function module (a name of its own: modules are imported once) into
    ``tmp_path``; returns its path."""

    def write(source: str) -> str:
        path = tmp_path / f"windowed_{uuid.uuid4().hex[:8]}.py"
        path.write_text(textwrap.dedent(source))
        return str(path)

    return write


class RunWindows:
    """Instances of window functions, each with a journaled state store in ``tmp_path``."""

    def __init__(self, client: pulsar.Client, tmp_path: Path) -> None:
        self._client = client
        self._tmp_path = tmp_path
        self._states: dict[FunctionInstance, JournaledStateStore] = {}

    def __call__(self, py: str, **fields: Any) -> FunctionInstance:
        fields.setdefault("subscription_position", "Earliest")
        config = FunctionConfig(py=py, **fields)
        directory = self._tmp_path / "state" / str(config.name)
        state = JournaledStateStore(self._client, config.fqfn, StateOptions(str(directory)))
        instance = FunctionInstance(config, self._client, OPTIONS, state=state)
        self._states[instance] = state
        return instance.start()

    def stop(self, instance: FunctionInstance) -> None:
        """Stop gracefully, and close the state store (as its process would on exit)."""
        instance.stop()
        assert instance.wait(30), "instance did not stop within 30 s"
        self._states.pop(instance).close()


@pytest.fixture
def run_windows(client: pulsar.Client, tmp_path: Path) -> Iterator[RunWindows]:
    runs = RunWindows(client, tmp_path)
    yield runs
    for instance in list(runs._states):
        runs.stop(instance)


SUM = """
def process(inputs):
    return str(sum(inputs))
"""


def test_tumbling_count_window_publishes_once_per_window(
    client: pulsar.Client, run_windows: RunWindows, code: Callable[[str], str], topic: str
) -> None:
    instance = run_windows(
        code(SUM),
        name="sum",
        inputs=[topic],
        output=f"{topic}-out",
        window_config={"windowLengthCount": 3},
    )
    producer = client.create_producer(topic)
    sent = [
        producer.send(str(i).encode(), properties={"batch": str(i // 3)}, partition_key=f"k{i}")
        for i in range(1, 9)
    ]
    out = collect(client, f"{topic}-out", 2)
    assert values(out) == ["6", "15"]  # 1+2+3, 4+5+6; 7 and 8 wait for the third window
    newest = pulsar.MessageId.deserialize(
        base64.b64decode(out[1].properties()["__pfn_input_msg_id__"])
    )
    assert (newest.ledger_id(), newest.entry_id()) == (sent[5].ledger_id(), sent[5].entry_id())
    assert out[1].properties()["batch"] == "2"  # the newest input's, forwarded
    assert out[1].partition_key() == ""  # a window has no one key
    wait_for(lambda: instance.metrics.received == 8)
    status = instance.snapshot().status()["status"]
    assert (status["numReceived"], status["numSuccessfullyProcessed"]) == (8, 8)
    assert status["numUserExceptions"] == 0


def test_at_most_once_windows_acknowledge_on_receipt_and_drop_a_failed_window(
    client: pulsar.Client, run_windows: RunWindows, code: Callable[[str], str], topic: str
) -> None:
    module = code(
        """
        def process(inputs):
            if "bad" in inputs:
                raise ValueError("dropped")
            return "+".join(inputs)
        """
    )
    instance = run_windows(
        module,
        name="at-most-once",
        inputs=[topic],
        output=f"{topic}-out",
        processing_guarantees="ATMOST_ONCE",
        window_config={"windowLengthCount": 2},
    )
    produce(client, topic, ["a", "b", "bad", "c", "d", "e"])
    assert values(collect(client, f"{topic}-out", 2)) == ["a+b", "d+e"]
    assert instance.metrics.user_exceptions == 1  # not retried


RECORDS = """
import json

def process(inputs, context):
    window = context.get_window()
    return json.dumps({
        "values": inputs,
        "keys": [r.key for r in window.get()],
        "event_times": [r.event_time for r in window.get()],
        "properties": [r.properties for r in window.get()],
        "topics": sorted({r.topic for r in window.get()}),
        "ids": [[r.message_id.ledger_id(), r.message_id.entry_id()] for r in window.get()],
        "new": [r.value for r in window.get_new()],
        "expired": [r.value for r in window.get_expired()],
        "bounds": [window.get_start_timestamp(), window.get_end_timestamp()],
        "current": str(context.get_message_key()),
    })
"""


def test_sliding_count_window_gives_the_function_every_record(
    client: pulsar.Client, run_windows: RunWindows, code: Callable[[str], str], topic: str
) -> None:
    run_windows(
        code(RECORDS),
        name="records",
        inputs=[topic],
        output=f"{topic}-out",
        window_config={"windowLengthCount": 4, "slidingIntervalCount": 2},
    )
    producer = client.create_producer(topic)
    ids = [
        producer.send(
            f"v{i}".encode(),
            partition_key=f"key-{i}",
            event_timestamp=1_700_000_000_000 + i,
            properties={"n": str(i)},
        )
        for i in range(6)
    ]
    windows = [json.loads(v) for v in values(collect(client, f"{topic}-out", 3))]
    assert [w["values"] for w in windows] == [
        ["v0", "v1"],
        ["v0", "v1", "v2", "v3"],
        ["v2", "v3", "v4", "v5"],
    ]
    assert [w["new"] for w in windows] == [["v0", "v1"], ["v2", "v3"], ["v4", "v5"]]
    assert [w["expired"] for w in windows] == [[], [], ["v0", "v1"]]
    last = windows[2]
    assert last["keys"] == ["key-2", "key-3", "key-4", "key-5"]
    assert last["event_times"] == [1_700_000_000_000 + i for i in range(2, 6)]
    assert last["properties"] == [{"n": str(i)} for i in range(2, 6)]
    assert last["topics"] == [f"persistent://public/default/{topic}"]
    assert last["ids"] == [[m.ledger_id(), m.entry_id()] for m in ids[2:]]
    assert last["bounds"][0] is None  # a count window has no start
    assert last["current"] == "key-5"  # the context's message is the window's newest


def test_tumbling_time_window_holds_each_input_once(
    client: pulsar.Client, run_windows: RunWindows, code: Callable[[str], str], topic: str
) -> None:
    run_windows(
        code(RECORDS),
        name="timed",
        inputs=[topic],
        output=f"{topic}-out",
        window_config={"windowLengthDurationMs": 300},
    )
    produce(client, topic, ["a", "b", "c"])
    first = json.loads(values(collect(client, f"{topic}-out", 1, subscription="one"))[0])
    produce(client, topic, ["d", "e"])
    deadline = time.monotonic() + 15
    windows: list[dict[str, Any]] = []
    while sum(len(w["values"]) for w in windows) < 5 and time.monotonic() < deadline:
        windows = [json.loads(v) for v in values(collect(client, f"{topic}-out", 5, 2))]
    assert [v for w in windows for v in w["values"]] == ["a", "b", "c", "d", "e"]
    assert windows[0] == first
    for window in windows:
        start, end = window["bounds"]
        assert end - start == 300
        assert window["values"]  # a window without inputs does not fire
    # consecutive windows of a tumbling time window meet
    assert all(
        later["bounds"][0] >= earlier["bounds"][1] for earlier, later in itertools.pairwise(windows)
    )


def test_event_time_windows_follow_the_watermark_and_late_inputs_go_aside(
    client: pulsar.Client, run_windows: RunWindows, code: Callable[[str], str], topic: str
) -> None:
    run_windows(
        code(RECORDS),
        name="event-time",
        inputs=[topic],
        output=f"{topic}-out",
        window_config={
            "windowLengthDurationMs": 100,
            "timestampExtractorClassName": "magnetar.instance.windowing.EventTime",
            "watermarkEmitIntervalMs": 50,
            "lateDataTopic": f"{topic}-late",
        },
    )
    producer = client.create_producer(topic)

    def send(*times: int) -> None:
        for ts in times:
            producer.send(f"t{ts}".encode(), event_timestamp=ts)

    send(1010, 1050, 1120, 1190, 1210)
    out = collect(client, f"{topic}-out", 2, subscription="first")
    windows = [json.loads(v) for v in values(out)]
    assert [w["values"] for w in windows] == [["t1010", "t1050"], ["t1120", "t1190"]]
    assert [w["bounds"] for w in windows] == [[1000, 1100], [1100, 1200]]
    assert [m.event_timestamp() for m in out] == [1100, 1200]  # the window's end
    send(1005)  # older than the watermark (1210): late
    assert values(collect(client, f"{topic}-late", 1)) == ["t1005"]
    send(1400)
    windows = [json.loads(v) for v in values(collect(client, f"{topic}-out", 4))]
    assert [w["values"] for w in windows[2:]] == [["t1210"], ["t1400"]]


def test_event_time_from_the_value_with_the_functions_own_extractor(
    client: pulsar.Client, run_windows: RunWindows, code: Callable[[str], str], topic: str
) -> None:
    module = code(
        """
        class Timestamp:
            def extract_timestamp(self, input):
                return int(input.split("@")[1])

        def process(inputs):
            return ",".join(inputs)
        """
    )
    run_windows(
        module,
        name="extracted",
        inputs=[topic],
        output=f"{topic}-out",
        window_config={
            "windowLengthCount": 2,
            "timestampExtractorClassName": f"{Path(module).stem}.Timestamp",
            "watermarkEmitIntervalMs": 50,
        },
    )
    produce(client, topic, ["a@10", "b@20", "c@30", "d@40", "e@50"])
    assert values(collect(client, f"{topic}-out", 2)) == ["a@10,b@20", "c@30,d@40"]


def test_an_async_window_function_is_awaited_once_per_window(
    client: pulsar.Client, run_windows: RunWindows, code: Callable[[str], str], topic: str
) -> None:
    module = code(
        """
        import asyncio

        async def process(inputs, context):
            await asyncio.sleep(0.01)
            return f"{len(context.get_window().get())}:{'/'.join(inputs)}"
        """
    )
    run_windows(
        module,
        name="async",
        inputs=[topic],
        output=f"{topic}-out",
        window_config={"windowLengthCount": 2},
    )
    produce(client, topic, ["a", "b", "c", "d"])
    assert values(collect(client, f"{topic}-out", 2)) == ["2:a/b", "2:c/d"]


def test_a_failing_window_is_retried_then_its_inputs_are_dead_lettered(
    client: pulsar.Client, run_windows: RunWindows, code: Callable[[str], str], topic: str
) -> None:
    module = code(
        """
        def process(inputs):
            if "bad" in inputs:
                raise ValueError("a bad window")
            return "+".join(inputs)
        """
    )
    instance = run_windows(
        module,
        name="failing",
        inputs=[topic],
        output=f"{topic}-out",
        max_message_retries=2,
        dead_letter_topic=f"{topic}-dlq",
        window_config={"windowLengthCount": 2},
    )
    produce(client, topic, ["a", "b", "bad", "c", "d", "e"])
    assert values(collect(client, f"{topic}-out", 2)) == ["a+b", "d+e"]
    dead = collect(client, f"{topic}-dlq", 2)
    assert values(dead) == ["bad", "c"]
    assert dead[0].properties()["REAL_TOPIC"] == f"persistent://public/default/{topic}"
    wait_for(lambda: instance.metrics.user_exceptions == 3)  # the first call and 2 retries
    assert instance.snapshot().status()["status"]["numUserExceptions"] == 3


def test_a_restarted_instance_neither_loses_an_input_nor_fires_a_window_twice(
    client: pulsar.Client, run_windows: RunWindows, code: Callable[[str], str], topic: str
) -> None:
    module = code(RECORDS)
    fields: dict[str, Any] = {
        "name": "restarted",
        "inputs": [topic],
        "output": f"{topic}-out",
        "window_config": {"windowLengthCount": 4, "slidingIntervalCount": 2},
    }
    first = run_windows(module, **fields)
    produce(client, topic, [f"v{i}" for i in range(7)])  # v6 is mid-window at the stop
    assert len(collect(client, f"{topic}-out", 3, subscription="before")) == 3
    run_windows.stop(first)
    run_windows(module, **fields)
    produce(client, topic, [f"v{i}" for i in range(7, 10)])
    windows = [json.loads(v) for v in values(collect(client, f"{topic}-out", 5))]
    assert [w["values"] for w in windows] == [
        ["v0", "v1"],
        ["v0", "v1", "v2", "v3"],
        ["v2", "v3", "v4", "v5"],
        ["v4", "v5", "v6", "v7"],
        ["v6", "v7", "v8", "v9"],
    ]
    assert [w["new"] for w in windows[3:]] == [["v6", "v7"], ["v8", "v9"]]


def test_localrun_window_function_killed_mid_window_loses_nothing_and_fires_nothing_twice(
    client: pulsar.Client,
    broker_url: str,
    code: Callable[[str], str],
    topic: str,
    tmp_path: Path,
) -> None:
    name = f"killed-{uuid.uuid4().hex[:6]}"
    command = [
        *MAGNETAR,
        "--broker-url",
        broker_url,
        "functions",
        "localrun",
        "--py",
        code(SUM),
        "--name",
        name,
        "--inputs",
        topic,
        "--output",
        f"{topic}-out",
        "--subs-position",
        "Earliest",
        "--window-length-count",
        "5",
        "--state-dir",
        str(tmp_path / "localrun-state"),
    ]
    queries = StateQueryService(client, tmp_path / "queries")
    producer = client.create_producer(topic, batching_enabled=False)
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        sent = [producer.send(str(i).encode()) for i in range(1, 13)]  # 11 and 12 mid-window
        assert values(collect(client, f"{topic}-out", 2, 30, "before")) == ["15", "40"]
        # the second window's checkpoint is stored once its output is: its inputs are done
        tenth = (f"persistent://public/default/{topic}", position(sent[9]))
        wait_for(lambda: tenth in checkpointed_done(queries, f"public/default/{name}"), 30)
        [pid] = instance_pids(first.pid)
        os.kill(pid, signal.SIGKILL)
        output, _ = first.communicate(timeout=60)
        assert "instance 0 failed" in output
    finally:
        if first.poll() is None:
            first.kill()
        queries.stop()
    second = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for i in range(13, 21):
            producer.send(str(i).encode())
        assert values(collect(client, f"{topic}-out", 4, 60)) == ["15", "40", "65", "90"]
    finally:
        second.send_signal(signal.SIGINT)
        output, _ = second.communicate(timeout=60)
    assert second.returncode == 0, output


def checkpointed_done(queries: StateQueryService, fqfn: str) -> DoneRuns:
    """The inputs the stored window checkpoint of instance 0 counts as done."""
    entry = queries.get(fqfn, checkpoint_key(0))
    if entry is None or entry.value is None:
        return DoneRuns()
    return DoneRuns(Checkpoint.decode(entry.value).done)


def test_a_failed_send_resumes_the_windows_from_their_checkpoint_losing_nothing(
    client: pulsar.Client, run_windows: RunWindows, code: Callable[[str], str], topic: str
) -> None:
    module = code(
        f"""
        calls = []

        def process(inputs, context):
            calls.append(inputs)
            if len(calls) == 2:  # the second window's publish is refused: too large
                context.publish("{topic}-side", "x" * 6_000_000)
            return "+".join(inputs)
        """
    )
    instance = run_windows(
        module,
        name="resumed",
        inputs=[topic],
        output=f"{topic}-out",
        window_config={"windowLengthCount": 2},
    )
    reader = client.subscribe(
        f"{topic}-out", "reader", initial_position=pulsar.InitialPosition.Earliest
    )
    produce(client, topic, ["a", "b", "c", "d", "e", "f"])
    wait_for(lambda: instance.metrics.system_exceptions == 1, 30)
    outputs: list[str] = []
    try:
        while True:  # until the resumed windows have fired too
            message = reader.receive(3_000)
            reader.acknowledge(message)
            outputs.append(message.data().decode())
    except pulsar.Timeout:
        reader.close()
    status = instance.snapshot().status()["status"]
    assert "MessageTooBig" in status["latestSystemExceptions"][0]["exceptionString"]
    # the windows after the last checkpoint fire again; none is lost, the order is kept
    assert list(dict.fromkeys(outputs)) == ["a+b", "c+d", "e+f"]
    assert outputs[-1] == "e+f"
    assert instance.metrics.system_exceptions == 1  # the second time, nothing failed
