"""Timers on one instance with its journaled state store (real broker, real RocksDB): a
JavaScript handler in Couchbase Eventing's style, and what a Python function is told when it
arms a timer wrongly or its callback keeps failing."""

from __future__ import annotations

import json
import math
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions
from magnetar.instance.delivery import ChunkSender
from magnetar.instance.timer_once import OnceFirings
from magnetar.instance.timer_runner import timer_properties
from magnetar.instance.timers import Timers
from magnetar.statestore import JournaledStateStore, StateOptions, StateTable, journal_topic
from magnetar.worker.broker_admin import BrokerAdmin
from tests.conftest import EXAMPLES
from tests.integration.conftest import collect, produce

RunStateful = Callable[..., FunctionInstance]


@pytest.fixture
def run_stateful(client: pulsar.Client, tmp_path: Path) -> Iterator[RunStateful]:
    started: list[tuple[FunctionInstance, JournaledStateStore]] = []

    def start(**fields: Any) -> FunctionInstance:
        fields.setdefault("name", f"timers-{uuid.uuid4().hex[:8]}")
        fields.setdefault("subscription_position", "Earliest")
        config = FunctionConfig(**fields)
        state = JournaledStateStore(
            client,
            config.fqfn,
            # a namespace Apache Pulsar has from the start (a worker creates its own)
            StateOptions(str(tmp_path / f"state-{len(started)}"), namespace="public/default"),
        )
        instance = FunctionInstance(
            config, client, InstanceOptions(retry_delay_ms=100), state=state
        )
        started.append((instance.start(), state))
        return instance

    yield start
    for instance, _ in started:
        instance.stop()
    for instance, state in started:
        assert instance.wait(30)
        state.close()


def wait_for(condition: Callable[[], bool], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def status(instance: FunctionInstance) -> dict[str, Any]:
    result: dict[str, Any] = instance.snapshot().status()["status"]
    return result


@pytest.mark.brokers("lite", "apache")
def test_javascript_timers_in_couchbase_style(
    client: pulsar.Client, run_stateful: RunStateful, topic: str
) -> None:
    now = time.time()
    commands = [
        {"arm": "late", "at": now - 5, "note": "past due"},
        {"arm": "soon", "at": now + 0.5, "note": "first"},
        {"arm": "soon", "at": now + 1.0, "note": "replaced"},
        {"arm": "never", "at": now + 1.0, "note": "cancelled"},
        {"cancel": "never"},
        {"cancel": "unknown"},
        {"every": "tick", "seconds": 0.2, "times": 3},
    ]
    produce(client, topic, [json.dumps(c) for c in commands])
    instance = run_stateful(
        js=str(EXAMPLES / "reminders.js"),
        inputs=[topic],
        custom_serde_inputs={topic: "json"},
        output=f"{topic}-out",
    )
    got = [json.loads(m.data()) for m in collect(client, f"{topic}-out", 7, timeout=20)]
    assert [o for o in got if "cancelled" in o] == [
        {"cancelled": "never", "was_pending": True},
        {"cancelled": "unknown", "was_pending": False},
    ]
    fired = [(o["fired"], o.get("note"), o.get("left")) for o in got if "fired" in o]
    assert sorted(fired, key=str) == sorted(
        [
            ("late", "past due", None),
            ("soon", "replaced", None),
            ("tick", None, 2),
            ("tick", None, 1),
            ("tick", None, 0),
        ],
        key=str,
    )
    soon = next(o for o in got if o.get("fired") == "soon")
    # not before its date, which JavaScript holds in whole milliseconds (new Date truncates)
    assert soon["at"] >= math.floor((now + 1.0) * 1000) / 1000
    wait_for(lambda: status(instance)["numTimersFired"] == 5)
    wait_for(lambda: status(instance)["numTimersPending"] == 0)  # refreshed once a second
    assert status(instance)["numUserExceptions"] == 0


def script(tmp_path: Path, source: str) -> str:
    path = tmp_path / f"fn_{uuid.uuid4().hex[:6]}.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


def test_a_python_timer_armed_wrongly_fails_its_input_saying_why(
    client: pulsar.Client, run_stateful: RunStateful, topic: str, tmp_path: Path
) -> None:
    path = script(
        tmp_path,
        """
        import time

        def process(input, context):
            if input == "payload":
                context.create_timer(fired, time.time(), "r", {"not json": object()})
            elif input == "lambda":
                context.create_timer(lambda p, c: p, time.time(), "r")
            elif input == "when":
                context.create_timer(fired, "tomorrow", "r")
            return None

        def fired(payload, context):
            return "fired"
        """,
    )
    produce(client, topic, ["payload", "lambda", "when"])
    instance = run_stateful(
        py=path, class_name=Path(path).stem, inputs=[topic], processing_guarantees="ATMOST_ONCE"
    )
    wait_for(lambda: status(instance)["numUserExceptions"] == 3)
    errors = [e["exceptionString"] for e in status(instance)["latestUserExceptions"]]
    assert errors[0].startswith("TypeError: timer 'r': the payload must be JSON"), errors
    assert errors[1].startswith(
        "TypeError: a timer's callback must be a method of the function's class or a function "
        "defined at the top level of a module"
    ), errors
    assert errors[2].startswith(
        "TypeError: a timer's time must be epoch seconds (int or float) or a datetime, got "
        "str 'tomorrow'"
    ), errors


def test_a_failing_timer_callback_is_retried_then_dead_lettered(
    client: pulsar.Client, run_stateful: RunStateful, topic: str, tmp_path: Path
) -> None:
    path = script(
        tmp_path,
        """
        import time

        def process(input, context):
            context.create_timer(fragile, time.time(), input, {"ref": input})

        def fragile(payload, context):
            context.incr_counter("attempts", 1)
            raise ValueError("callback failed for " + payload["ref"])
        """,
    )
    produce(client, topic, ["r1"])
    instance = run_stateful(
        py=path,
        class_name=Path(path).stem,
        inputs=[topic],
        output=f"{topic}-out",
        max_message_retries=2,
        dead_letter_topic=f"{topic}-dlq",
    )
    dead = collect(client, f"{topic}-dlq", 1)
    assert json.loads(dead[0].data()) == {"ref": "r1"}
    assert dead[0].properties()["TIMER_REFERENCE"] == "r1"
    wait_for(lambda: status(instance)["numDeadLettered"] == 1)
    current = status(instance)
    assert current["numUserExceptions"] == 3  # the first attempt and two retries
    assert current["latestUserExceptions"][0]["exceptionString"] == (
        "ValueError: callback failed for r1"
    )
    assert current["numTimersFired"] == 0
    wait_for(lambda: status(instance)["numTimersPending"] == 0)


COUNTED = """
import json

from pulsar import Function


class Counted(Function):
    def process(self, input, context):
        reference, due = input.split()
        context.create_timer(self.ring, float(due), reference, reference)

    def ring(self, payload, context):
        context.incr_counter("fired", 1)
        return json.dumps({"fired": payload})
"""


def every_output(client: pulsar.Client, topic: str) -> list[str]:
    """The references the whole output topic holds, repeats included."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    found: list[str] = []
    try:
        while True:
            try:
                message = reader.read_next(2000)
            except pulsar.Timeout:
                return found
            found.append(json.loads(message.data())["fired"])
    finally:
        reader.close()


def counted_code_and_output(apache_pulsar: Any, topic: str, tmp_path: Path) -> tuple[Path, str]:
    """``COUNTED`` written to a file, and its output topic with deduplication on."""
    code = tmp_path / "counted.py"
    code.write_text(COUNTED)
    output = f"{topic}-out"
    admin = BrokerAdmin(apache_pulsar.admin_url)
    admin.create_topic(output)
    admin.enable_deduplication(output)
    admin.close()
    return code, output


def counted_config(code: Path, topic: str, output: str, **fields: Any) -> FunctionConfig:
    """The config of ``COUNTED`` (written to ``code``) from ``topic`` into ``output``,
    effectively once."""
    return FunctionConfig(
        py=str(code),
        class_name="counted.Counted",
        inputs=[topic],
        output=output,
        processing_guarantees="EFFECTIVELY_ONCE",
        **fields,
    )


@pytest.mark.brokers("apache")
def test_two_owners_of_the_same_timers_fire_each_once_under_effectively_once(
    client: pulsar.Client, apache_pulsar: Any, topic: str, tmp_path: Path
) -> None:
    """An owner change caught midway (the old owner at parallelism 1, instance 1 of the new
    parallelism 2, both running): both fire the timers instance 1 owns, each on a lane of
    its own; each timer fires once all the same, its output and its count."""
    code, output = counted_code_and_output(apache_pulsar, topic, tmp_path)
    name = f"owners-{uuid.uuid4().hex[:6]}"
    references = [f"r{i}" for i in range(200)]
    due = time.time() + 3
    produce(client, topic, [f"{r} {due + i / 200}" for i, r in enumerate(references)])
    started: list[tuple[FunctionInstance, JournaledStateStore]] = []
    try:
        for parallelism, instance_id in ((1, 0), (2, 1)):
            config = counted_config(
                code,
                topic,
                output,
                name=name,
                subscription_position="Earliest",
                parallelism=parallelism,
            )
            directory = str(tmp_path / f"state-{instance_id}")
            state = JournaledStateStore(
                client, config.fqfn, StateOptions(directory, namespace="public/default"), True
            )
            options = InstanceOptions(instance_id=instance_id)
            started.append((FunctionInstance(config, client, options, state=state), state))
        for instance, _ in started:
            instance.start()
        wait_for(lambda: len(collect(client, output, 200, 30)) >= 200, 30)
        time.sleep(2)  # a firing lost in the race would publish by now
        fired = every_output(client, output)
        by_instance = [instance.metrics.timers_fired for instance, _ in started]
        table = StateTable(client, journal_topic(config.fqfn, "public/default"), tmp_path / "t")
        table.start().catch_up(20)
        count = table.get("fired")
        table.stop()
    finally:
        for instance, _ in started:
            instance.stop()
        for instance, state in started:
            instance.wait(30)
            state.close()
    repeated = sorted({r for r in fired if fired.count(r) > 1})
    assert repeated == [], f"fired more than once: {repeated}"
    assert sorted(fired) == sorted(references)
    assert count is not None and count.counter == 200, count
    assert by_instance[1] > 0, by_instance  # instance 1 fired some: the race took place


@pytest.mark.brokers("apache")
def test_a_firing_left_unpublished_by_an_instance_gone_is_published_once_by_its_heir(
    client: pulsar.Client, apache_pulsar: Any, topic: str, tmp_path: Path
) -> None:
    """Instance 1 of 2 fired "r1" (its count and removal journaled) and died before its
    output left; the function runs on at parallelism 1: instance 0 publishes r1's output,
    without counting it again or firing it twice, and fires "r2" as usual."""
    code, output = counted_code_and_output(apache_pulsar, topic, tmp_path)
    fqfn = f"public/default/heir-{uuid.uuid4().hex[:6]}"
    journal_options = StateOptions(str(tmp_path / "gone"), namespace="public/default")
    gone = JournaledStateStore(client, fqfn, journal_options, True)
    timers = Timers(gone)
    now = time.time()
    for reference in ("r1", "r2"):
        timers.arm("method:ring", now - 1, reference, reference)
    gone.commit_unsourced()
    sender = ChunkSender(1 << 20)
    firings = OnceFirings(
        gone,
        timers,
        instance_id=1,
        parallelism=2,
        lane_producer=lambda name: None,  # it died before sending
        lane_name=str,
        fire=str,
        encode=str.encode,
        properties=timer_properties,
        sender=sender,
        on_refire_error=lambda timer, error: None,
        max_retries=None,
        has_output=True,
    )
    timer = timers.get("r1")
    assert timer is not None
    firings.firing(timer)
    gone.incr("fired", 1)  # what the callback did
    firings.fired(timer, json.dumps({"fired": "r1"}))
    payloads, _ = gone.drain()
    journal = client.create_producer(gone.journal_topic)
    for payload in payloads:
        journal.send(payload)
    journal.close()
    sender.close()
    gone.close()

    tenant, namespace, name = fqfn.split("/")
    config = counted_config(code, topic, output, tenant=tenant, namespace=namespace, name=name)
    options = StateOptions(str(tmp_path / "heir"), namespace="public/default")
    state = JournaledStateStore(client, fqfn, options, True)
    instance = FunctionInstance(config, client, InstanceOptions(), state=state).start()
    try:
        wait_for(lambda: len(collect(client, output, 2, 15)) >= 2, 30)
        time.sleep(1)  # a repeat would be published by now
        fired = every_output(client, output)
    finally:
        instance.stop()
        instance.wait(30)
        state.close()
    table = StateTable(client, journal_topic(fqfn, "public/default"), tmp_path / "t")
    table.start().catch_up(20)
    count = table.get("fired")
    table.stop()
    assert sorted(fired) == ["r1", "r2"]
    assert count is not None and count.counter == 2, count
