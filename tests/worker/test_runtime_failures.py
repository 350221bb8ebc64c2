"""What user code can do to its instance process, and what the worker makes of it: a message
that kills the process is that message's failure (retried, then dead-lettered)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.instance.instance_log import instance_log_path
from magnetar.worker.runtime import InstanceLogs, ProcessRuntime
from magnetar.worker.runtime_manager import BackoffPolicy
from tests.integration.conftest import collect, produce, python_file, wait_for
from tests.worker.conftest import (
    WORKER_ID,
    StartManager,
    function_config,
    instance_specs,
    receive_until,
    system_exceptions,
)

FAST_RESTARTS = BackoffPolicy(initial_s=0.2, max_s=1.0)

KILLER = """
import os

def process(input):
    if input == "poison":
        os._exit(1)
    return input + "!"
"""


def test_a_message_that_kills_its_process_goes_to_the_dead_letter_topic(
    client: pulsar.Client, start_manager: StartManager, topic: str, tmp_path: Path
) -> None:
    dead_letters = f"{topic}-dlq"
    config = function_config(
        py=python_file(tmp_path, "user_fn.py", KILLER),
        inputs=[topic],
        output=f"{topic}-out",
        max_message_retries=1,
        dead_letter_topic=dead_letters,
    )
    (key,) = specs = instance_specs(config)
    manager = start_manager(restart_backoff=FAST_RESTARTS, liveness_interval_s=0.1)
    manager.apply(specs)
    produce(client, topic, ["a", "b", "poison", "c", "d"])

    # it died twice on the message (the first attempt and its one retry), then went on
    wait_for(lambda: getattr(manager.status(key), "dead_lettered", 0) == 1, timeout=30)
    (dead,) = collect(client, dead_letters, 1)
    assert dead.data() == b"poison"
    assert dead.properties()["REAL_TOPIC"] == f"persistent://public/default/{topic}"
    # at-least-once: an output may come twice (its input was not yet acknowledged at a death)
    outputs = receive_until(client, f"{topic}-out", {"a!", "b!", "c!", "d!"})
    assert set(outputs) == {"a!", "b!", "c!", "d!"}
    status = manager.status(key)
    assert status is not None
    assert status.num_restarts == 2
    crashes = [e.exception_string for e in status.latest_system_exceptions]
    assert len(crashes) == 2, crashes
    origin = dead.properties()["ORIGIN_MESSAGE_ID"]
    assert crashes[-1] == (
        "the instance process exited with code 1 while the function processed message "
        f"{origin} from persistent://public/default/{topic} (death 2 on that message)"
    )
    produce(client, topic, ["e"])
    # (pulsar-lite may hand "e" to a consumer of a dead process until its healer restarts it)
    assert "e!" in receive_until(client, f"{topic}-out", {"e!"}, timeout=30)


def test_ordered_inputs_wait_behind_a_message_that_kills_its_process(
    client: pulsar.Client, start_manager: StartManager, topic: str, tmp_path: Path
) -> None:
    config = function_config(
        py=python_file(tmp_path, "user_fn.py", KILLER),
        inputs=[topic],
        output=f"{topic}-out",
        max_message_retries=1,
        retain_ordering=True,
    )
    (key,) = specs = instance_specs(config)
    manager = start_manager(restart_backoff=FAST_RESTARTS, liveness_interval_s=0.1)
    manager.apply(specs)
    produce(client, topic, ["a", "poison", "b", "c"])

    # no dead-letter topic: the clients' default one
    wait_for(lambda: getattr(manager.status(key), "dead_lettered", 0) == 1, timeout=30)
    subscription = config.fqfn.replace("/", "-")
    (dead,) = collect(client, f"persistent://public/default/{topic}-{subscription}-DLQ", 1)
    assert dead.data() == b"poison"
    outputs = receive_until(client, f"{topic}-out", {"a!", "b!", "c!"})
    assert list(dict.fromkeys(outputs)) == ["a!", "b!", "c!"]  # in order, "a!" maybe twice


ASYNC_KILLER = """
import asyncio
import os

async def process(input):
    if input == "poison":
        os._exit(1)
    await asyncio.sleep(0.2)
    return input + "!"
"""


def dead_letter_the_poison(
    client: pulsar.Client, start_manager: StartManager, topic: str, **fields: Any
) -> tuple[Any, list[str]]:
    """Run a function (``fields``, retried once, with a dead-letter topic) over inputs
    produced before it starts, so that they are in flight together, until "poison" is
    dead-lettered and every other input has its output; the dead letter and the crashes
    its status shows."""
    config = function_config(
        inputs=[topic],
        output=f"{topic}-out",
        max_message_retries=1,
        dead_letter_topic=f"{topic}-dlq",
        **fields,
    )
    (key,) = specs = instance_specs(config)
    manager = start_manager(restart_backoff=FAST_RESTARTS, liveness_interval_s=0.1)
    produce(client, topic, ["a", "b", "poison", "c", "d"])
    manager.apply(specs)

    wait_for(lambda: getattr(manager.status(key), "dead_lettered", 0) == 1, timeout=60)
    (dead,) = collect(client, f"{topic}-dlq", 1)
    assert dead.data() == b"poison"
    outputs = receive_until(client, f"{topic}-out", {"a!", "b!", "c!", "d!"})
    assert set(outputs) == {"a!", "b!", "c!", "d!"}
    status = manager.status(key)
    assert status is not None
    return dead, [e.exception_string for e in status.latest_system_exceptions]


def test_an_async_function_finds_the_message_that_kills_it_among_those_in_flight(
    client: pulsar.Client, start_manager: StartManager, topic: str, tmp_path: Path
) -> None:
    dead, crashes = dead_letter_the_poison(
        client, start_manager, topic, py=python_file(tmp_path, "user_fn.py", ASYNC_KILLER)
    )
    origin = dead.properties()["ORIGIN_MESSAGE_ID"]
    # it died with "a" and "b" still sleeping: all three suspects, then each ran alone
    assert re.fullmatch(
        r"the instance process exited with code 1 while the function had 3 messages in user "
        r"code, the oldest message \S+ from \S+; they run one at a time now, to find the one "
        r"it died on",
        crashes[0],
    ), crashes
    assert crashes[1:] == [
        "the instance process exited with code 1 while the function processed message "
        f"{origin} from persistent://public/default/{topic} (death {death} on that message)"
        for death in (1, 2)
    ]


JS_HOG = """
function process(input) {
    if (input === "poison") {
        const held = new Uint8Array(512 * 1024 * 1024);
        held.fill(1);
        for (;;) {}
    }
    return input + "!";
}
"""


def test_a_javascript_message_that_kills_its_process_is_found_in_its_chunk(
    client: pulsar.Client, start_manager: StartManager, topic: str, tmp_path: Path
) -> None:
    script = tmp_path / "hog.js"
    script.write_text(JS_HOG)
    _, crashes = dead_letter_the_poison(
        client,
        start_manager,
        topic,
        runtime="JAVASCRIPT",
        js=str(script),
        timeout_ms=60_000,
        resources={"ram": 256 * 1024 * 1024},
    )
    # The chunk the poison died in holds what the client had received by then: all five
    # inputs as a rule, but pulsar-lite may dispatch the first ones alone, and a chunk of
    # the poison alone blames it at once (its first death).
    assert len(crashes) in (2, 3), crashes
    if len(crashes) == 3:
        assert re.search(r"while the function had [2-5] messages in user code", crashes[0])
    for death, crash in enumerate(crashes[-2:], 1):
        assert crash.startswith("out of memory: over resources.ram"), crash
        assert crash.endswith(
            f" from persistent://public/default/{topic} (death {death} on that message)"
        )


LEAKER = """
leaked = []

def process(input):
    leaked.append(b"x" * (32 * 1024 * 1024))
    return input + "!"
"""


def test_an_instance_over_its_resources_ram_is_killed_and_says_so(
    client: pulsar.Client, start_manager: StartManager, topic: str, tmp_path: Path
) -> None:
    ram = 256 * 1024 * 1024
    config = function_config(
        py=python_file(tmp_path, "user_fn.py", LEAKER),
        inputs=[topic],
        output=f"{topic}-out",
        resources={"ram": ram},
    )
    (key,) = specs = instance_specs(config)
    manager = start_manager(restart_backoff=FAST_RESTARTS, liveness_interval_s=0.1)
    manager.apply(specs)
    produce(client, topic, [f"m{i}" for i in range(12)])

    wait_for(lambda: bool(system_exceptions(manager, key, "out of memory")), timeout=30)
    said = system_exceptions(manager, key, "out of memory")[0]
    assert said.startswith(f"out of memory: over resources.ram {ram} bytes (it held "), said
    # each run is killed before it holds much more than its limit, and it runs again
    wait_for(lambda: key in manager.running_keys())
    pid = manager.pid(key)
    assert pid is not None


PRINTER = """
import sys

def process(input, context):
    print("printed " + input + " " + "p" * 4000)
    print("to stderr " + input, file=sys.stderr)
    context.get_logger().info("logged %s", input)
    return input + "!"
"""


def test_what_an_instance_prints_goes_to_its_own_rotated_log_file(
    client: pulsar.Client,
    broker_url: str,
    start_manager: StartManager,
    topic: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    logs = InstanceLogs(tmp_path / "logs", max_bytes=64 * 1024, backups=1)
    config = function_config(py=python_file(tmp_path, "user_fn.py", PRINTER), inputs=[topic])
    specs = instance_specs(config)
    manager = start_manager(ProcessRuntime(broker_url, WORKER_ID, logs=logs))
    manager.apply(specs)
    produce(client, topic, [f"m{i}" for i in range(60)])
    wait_for(lambda: sum(s.processed for s in manager.statuses().values()) == 60)

    log = instance_log_path(tmp_path / "logs", config.fqfn, 0)
    assert log == tmp_path / "logs/functions/public/default" / config.name / f"{config.name}-0.log"
    wait_for(lambda: "logged m59" in log.read_text())
    text = log.read_text()
    assert "printed m59 ppp" in text and "to stderr m59" in text
    assert "INFO magnetar.function." in text  # the function's logger, with its format
    # 60 prints of 4 KB: rolled over, one older file kept, each within the bound
    files = sorted(path.name for path in log.parent.iterdir())
    assert files == [log.name, f"{log.name}.1"]
    assert all(path.stat().st_size <= 64 * 1024 + 8 * 1024 for path in log.parent.iterdir())
    # and nothing of it in the worker's own output
    captured = capfd.readouterr()
    assert "printed m" not in captured.out + captured.err
    assert "logged m" not in captured.out + captured.err


SLEEPER = """
import time

def process(input):
    if input == "nap":
        time.sleep(3600)
    return input + "!"
"""


def test_status_names_a_message_user_code_has_had_too_long(
    client: pulsar.Client, start_manager: StartManager, topic: str, tmp_path: Path
) -> None:
    config = function_config(py=python_file(tmp_path, "user_fn.py", SLEEPER), inputs=[topic])
    (key,) = specs = instance_specs(config)
    manager = start_manager(busy_warning_s=1.0, stop_timeout_s=1.0)
    manager.apply(specs)
    produce(client, topic, ["a", "nap"])

    def error() -> str:
        status = manager.status(key)
        return status.error if status is not None else ""

    wait_for(lambda: "in user code" in error())
    assert re.fullmatch(
        rf"message \d+:\d+:-?\d+(:\d+)? from persistent://public/default/{topic} "
        r"in user code for \d+ s",
        error(),
    ), error()
    status = manager.status(key)
    assert status is not None and status.running is True


HOG = """
def process(input):
    if input == "huge":
        return len(b"x" * (4 * 1024 * 1024 * 1024))
    return input + "!"
"""


def test_an_allocation_beyond_resources_ram_fails_that_message_with_memory_error(
    client: pulsar.Client, start_manager: StartManager, topic: str, tmp_path: Path
) -> None:
    config = function_config(
        py=python_file(tmp_path, "user_fn.py", HOG),
        inputs=[topic],
        output=f"{topic}-out",
        resources={"ram": 256 * 1024 * 1024},
        max_message_retries=1,
    )
    (key,) = specs = instance_specs(config)
    manager = start_manager()
    manager.apply(specs)
    produce(client, topic, ["a", "huge", "b"])

    assert set(receive_until(client, f"{topic}-out", {"a!", "b!"})) == {"a!", "b!"}
    wait_for(lambda: getattr(manager.status(key), "dead_lettered", 0) == 1, timeout=30)
    status = manager.status(key)
    assert status is not None and status.running is True and status.num_restarts == 0
    assert status.latest_user_exceptions[0].exception_string == (
        "MemoryError: out of memory (the instance is limited by resources.ram)"
    )


KEEPER = """
kept = []

def process(input):
    kept.append(b"k" * (16 * 1024 * 1024))
    return input + "!"
"""


def test_a_function_that_keeps_memory_is_stopped_for_memory_not_threads(
    client: pulsar.Client, start_manager: StartManager, topic: str, tmp_path: Path
) -> None:
    # Memory the function holds on to is gone for the instance's own threads too: none of
    # them may start late, or the instance dies of "can't start new thread" instead. The
    # inputs wait before it starts, so that one chunk of them fills its memory before the
    # first batch of outputs is flushed.
    produce(client, topic, [f"m{i}" for i in range(20)])
    config = function_config(
        py=python_file(tmp_path, "user_fn.py", KEEPER),
        inputs=[topic],
        output=f"{topic}-out",
        resources={"ram": 128 * 1024 * 1024},
        subscription_position="Earliest",
    )
    (key,) = specs = instance_specs(config)
    manager = start_manager(restart_backoff=FAST_RESTARTS)
    manager.apply(specs)

    first = {"m0!", "m1!", "m2!"}
    assert first <= set(receive_until(client, f"{topic}-out", first))

    def errors() -> list[str]:
        status = manager.status(key)
        assert status is not None
        found = [status.error, *(e.exception_string for e in status.latest_system_exceptions)]
        return [*filter(None, found), *(e.exception_string for e in status.latest_user_exceptions)]

    # What the chunk left behind: it ran out of memory, and said so (the messages failed
    # with MemoryError, or the instance was killed over its limit), never of threads.
    memory = ("out of memory: over resources.ram", "MemoryError: out of memory")
    wait_for(lambda: bool(errors()), timeout=10)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert [e for e in errors() if not e.startswith(memory)] == []
        time.sleep(0.1)


@pytest.mark.brokers("lite")
def test_an_instance_over_its_ram_is_stopped_before_it_is_killed(
    client: pulsar.Client, start_manager: StartManager, topic: str, tmp_path: Path
) -> None:
    # Stopped, it finishes what it was given and acknowledges it: none of its outputs comes
    # twice (killed outright, inputs it had answered were handed to it again). A process
    # killed while the broker writes to it also leaves its consumers behind on pulsar-lite,
    # whose healer then restarts the broker under every other function.
    config = function_config(
        py=python_file(tmp_path, "user_fn.py", LEAKER),
        inputs=[topic],
        output=f"{topic}-out",
        resources={"ram": 160 * 1024 * 1024},
        subscription_position="Earliest",
    )
    inputs = [f"m{i}" for i in range(24)]
    produce(client, topic, inputs)
    (key,) = specs = instance_specs(config)
    manager = start_manager(restart_backoff=FAST_RESTARTS, liveness_interval_s=0.1)
    manager.apply(specs)

    outputs = receive_until(client, f"{topic}-out", {f"{i}!" for i in inputs}, timeout=60)
    status = manager.status(key)
    assert status is not None and status.num_restarts >= 2
    assert status.latest_system_exceptions[0].exception_string.startswith(
        "out of memory: over resources.ram"
    )
    assert sorted(outputs) == sorted(f"{i}!" for i in inputs)
