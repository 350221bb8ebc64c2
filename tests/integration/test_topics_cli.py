"""`magnetar topics produce|consume`, run as a user runs them: a subprocess against the broker."""

from __future__ import annotations

import json
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pulsar
import pytest

from tests.conftest import MAGNETAR, ROOT


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MAGNETAR, *args],
        check=False,
        env={**env, "PYTHONIOENCODING": "utf-8"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=60,
    )


def full(topic: str) -> str:
    return f"persistent://public/default/{topic}"


def drain(consumer: pulsar.Consumer, count: int) -> list[pulsar.Message]:
    """Exactly ``count`` messages, asserting that no further one follows."""
    messages = [consumer.receive(timeout_millis=5000) for _ in range(count)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=300)
    return messages


# -- produce ------------------------------------------------------------------------------


def test_produce_sends_each_message_count_times_with_key_and_properties(
    cli_env: dict[str, str], client: pulsar.Client, topic: str
) -> None:
    result = run_cli(
        cli_env,
        *("topics", "produce", topic, "-m", "hello", "-m", "wörld", "-n", "2"),
        *("--key", "k1", "-p", "color=red", "-p", "eq=a=b"),
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"4 messages produced to {full(topic)}\n"
    assert result.stderr == ""
    consumer = client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
    messages = drain(consumer, 4)
    consumer.close()
    assert [m.data() for m in messages] == [
        b"hello",
        "wörld".encode(),
        b"hello",
        "wörld".encode(),
    ]
    assert {m.partition_key() for m in messages} == {"k1"}
    assert all(m.properties() == {"color": "red", "eq": "a=b"} for m in messages)


def test_produce_json_output_and_no_key(
    cli_env: dict[str, str], client: pulsar.Client, topic: str
) -> None:
    result = run_cli(cli_env, "--output", "json", "topics", "produce", topic, "-m", "one")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"topic": full(topic), "produced": 1}
    consumer = client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest)
    [message] = drain(consumer, 1)
    consumer.close()
    assert message.data() == b"one"
    assert message.partition_key() == ""
    assert message.properties() == {}


def test_produce_requires_a_message_and_key_value_properties(
    cli_env: dict[str, str], topic: str
) -> None:
    no_message = run_cli(cli_env, "topics", "produce", topic)
    bad_property = run_cli(cli_env, "topics", "produce", topic, "-m", "x", "-p", "novalue")

    assert no_message.returncode == 2
    assert "Missing option '-m'" in no_message.stderr
    assert bad_property.returncode == 2
    assert "'novalue' is not KEY=VALUE" in bad_property.stderr


# -- consume ------------------------------------------------------------------------------


def test_consume_prints_payloads_with_keys_and_acknowledges(
    cli_env: dict[str, str], client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic)
    producer.send(b"plain")
    producer.send("with key ✓".encode(), partition_key="k1")
    producer.send(b"bad \xff byte")
    producer.close()
    args = ("topics", "consume", topic, "-s", "sub", "--subscription-position", "Earliest")

    first = run_cli(cli_env, *args, "-n", "2", "--timeout", "10")
    # The same subscription resumes after what the first run acknowledged.
    second = run_cli(cli_env, *args, "--timeout", "10")

    assert first.returncode == 0, first.stderr
    assert first.stdout == "plain\n[k1] with key ✓\n"
    assert second.returncode == 0, second.stderr
    assert second.stdout == "bad \ufffd byte\n"


def test_consume_json_lines(cli_env: dict[str, str], client: pulsar.Client, topic: str) -> None:
    producer = client.create_producer(topic)
    producer.send(b"first", properties={"a": "1"}, partition_key="k", event_timestamp=1234)
    producer.send(b"second")
    producer.close()
    before = int(time.time() * 1000) - 60_000

    result = run_cli(
        cli_env,
        *("--output", "json", "topics", "consume", topic, "-n", "2"),
        *("--subscription-position", "Earliest", "-t", "Shared", "--timeout", "10"),
    )

    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 2
    for record in records:
        assert isinstance(record.pop("messageId"), str)
        assert record.pop("publishTimestamp") > before
    assert records == [
        {"key": "k", "properties": {"a": "1"}, "value": "first", "eventTimestamp": 1234},
        {"key": None, "properties": {}, "value": "second", "eventTimestamp": 0},
    ]


def test_consume_timeout_fails_with_a_message(cli_env: dict[str, str], topic: str) -> None:
    started = time.monotonic()
    result = run_cli(cli_env, "topics", "consume", topic, "--timeout", "1")

    assert result.returncode == 1
    assert result.stdout == ""
    assert f"no message within 1 s on {full(topic)}" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 15


def test_consume_forever_until_ctrl_c(
    cli_env: dict[str, str], client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic)
    producer.send(b"before ctrl-c")
    producer.close()
    process = subprocess.Popen(
        [*MAGNETAR, "topics", "consume", topic, "-n", "0", "--subscription-position", "Earliest"],
        env={**cli_env, "PYTHONIOENCODING": "utf-8"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
    )
    try:
        # The printed message shows the command is in its receive loop, -n 0 keeps it there.
        assert process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=20), "no output from consume"
        assert process.stdout.readline() == "before ctrl-c\n"
        time.sleep(0.5)
        assert process.poll() is None, "consume -n 0 exited by itself"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert process.returncode == 130
    assert "Traceback" not in stderr
    assert "Aborted" not in stderr


# -- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["produce", "-m", "x"], ["consume"]])
def test_missing_broker_url_is_a_usage_error(
    cli_env: dict[str, str], topic: str, command: list[str]
) -> None:
    env = {k: v for k, v in cli_env.items() if k != "MAGNETAR_BROKER_URL"}

    result = run_cli(env, "topics", command[0], topic, *command[1:])

    assert result.returncode == 2
    assert "pass --broker-url" in result.stderr
    assert "MAGNETAR_BROKER_URL" in result.stderr


@pytest.mark.parametrize("command", [["produce", "-m", "x"], ["consume"]])
def test_unreachable_broker_names_the_url(
    cli_env: dict[str, str], topic: str, command: list[str]
) -> None:
    started = time.monotonic()

    result = run_cli(
        cli_env, "--broker-url", "pulsar://127.0.0.1:1", "topics", command[0], topic, *command[1:]
    )

    assert result.returncode == 1
    assert "cannot reach the Pulsar broker at pulsar://127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 10


@pytest.fixture
def not_a_broker() -> Iterator[str]:
    """A TCP server that answers like a web server: reachable, but not Pulsar."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)  # so the thread notices `stop` soon
    port = server.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"pulsar://127.0.0.1:{port}"
    stop.set()
    thread.join(timeout=5)
    server.close()


def test_a_server_that_is_not_pulsar_fails_fast(
    cli_env: dict[str, str], topic: str, not_a_broker: str
) -> None:
    started = time.monotonic()

    result = run_cli(cli_env, "--broker-url", not_a_broker, "topics", "produce", topic, "-m", "x")

    assert result.returncode == 1
    assert f"cannot reach the Pulsar broker at {not_a_broker}" in result.stderr
    assert "not as a Pulsar broker" in result.stderr
    assert time.monotonic() - started < 10
