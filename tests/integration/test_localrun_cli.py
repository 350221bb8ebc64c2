"""`magnetar functions localrun` as a user runs it: a subprocess, real broker, Ctrl-C."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from tests.conftest import EXAMPLES, MAGNETAR
from tests.integration.conftest import collect, produce, values


class LocalRunProcess:
    """A running `magnetar functions localrun`, its stderr collected line by line."""

    def __init__(self, args: list[str], env: dict[str, str], global_args: list[str]) -> None:
        self.process = subprocess.Popen(
            [*MAGNETAR, *global_args, "functions", "localrun", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr_lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr_lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.stderr_lines)

    def wait_for_stderr(self, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.stderr)
            if match:
                return match
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} not in stderr:\n{self.stderr}")

    def interrupt(self, signum: int = signal.SIGINT, timeout: float = 60.0) -> tuple[int, str]:
        self.process.send_signal(signum)
        return self.exit(timeout)

    def exit(self, timeout: float = 60.0) -> tuple[int, str]:
        """The exit code and stdout, once the process ends."""
        # Not communicate(): the reader thread owns stderr, and both would lose lines.
        self.process.wait(timeout)
        self._reader.join(5)
        assert self.process.stdout is not None
        return self.process.returncode, self.process.stdout.read()


@pytest.fixture
def localrun(cli_env: dict[str, str]) -> Iterator[object]:
    started: list[LocalRunProcess] = []

    def start(
        *args: str, global_args: tuple[str, ...] = (), env: dict[str, str] | None = None
    ) -> LocalRunProcess:
        run = LocalRunProcess(list(args), env or cli_env, list(global_args))
        started.append(run)
        return run

    yield start
    for run in started:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()


def exclamation(topic: str) -> tuple[str, ...]:
    """The flags of the exclamation example from ``topic`` (its earliest) to ``<topic>-out``."""
    return (
        "--py",
        str(EXAMPLES / "exclamation.py"),
        "--classname",
        "exclamation.ExclamationFunction",
        "--inputs",
        topic,
        "--output",
        f"{topic}-out",
        "--subs-position",
        "Earliest",
    )


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MAGNETAR, "functions", "localrun", *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_pulsar_sdk_function_runs_against_a_separate_broker(
    localrun,
    client: pulsar.Client,
    topic: str,  # type: ignore[no-untyped-def]
) -> None:
    run = localrun(
        *exclamation(topic),
        "--status-interval",
        "0.5",
    )
    run.wait_for_stderr(r"Running public/default/ExclamationFunction \(1 instance\)")
    produce(client, topic, [f"msg-{i}" for i in range(10)])
    assert values(collect(client, f"{topic}-out", 10)) == [f"msg-{i}!" for i in range(10)]
    run.wait_for_stderr(r"\n\s+0\s+yes\s+10\s+10\s+0\s+0")  # the progress table
    code, stdout = run.interrupt(signal.SIGINT)
    assert code == 0
    header, row = stdout.strip().splitlines()
    assert header.split()[:4] == ["instance", "running", "received", "processed"]
    assert row.split()[:4] == ["0", "no", "10", "10"]


@pytest.mark.brokers("lite", "apache")
def test_effectively_once_outputs_are_named_after_their_input_where_the_broker_deduplicates(
    localrun,
    client: pulsar.Client,
    topic: str,
    broker_kind: str,  # type: ignore[no-untyped-def]
) -> None:
    run = localrun(
        *exclamation(topic),
        "--processing-guarantees",
        "EFFECTIVELY_ONCE",
    )
    run.wait_for_stderr(r"Running public/default/ExclamationFunction \(1 instance\)")
    produce(client, topic, ["a", "b", "c"])
    outputs = collect(client, f"{topic}-out", 3)

    assert values(outputs) == ["a!", "b!", "c!"]
    producers = {m.producer_name() for m in outputs}
    if broker_kind == "apache":  # as Apache Pulsar's instances name it: the broker deduplicates
        assert producers == {f"persistent://public/default/{topic}"}
    else:  # pulsar-lite cannot deduplicate: one batched producer named by the broker
        assert len(producers) == 1 and topic not in producers.pop()
    assert run.interrupt(signal.SIGINT)[0] == 0


def test_parallel_instances_share_the_input(
    localrun,
    client: pulsar.Client,
    topic: str,  # type: ignore[no-untyped-def]
) -> None:
    run = localrun(
        "--py",
        str(EXAMPLES / "native_exclamation.py"),
        "--name",
        "par",
        "--inputs",
        topic,
        "--output",
        f"{topic}-out",
        "--parallelism",
        "2",
        "--subs-position",
        "Earliest",
        global_args=("--output", "json"),
    )
    run.wait_for_stderr(r"\(2 instances\)")
    produce(client, topic, [f"m{i}" for i in range(200)])
    assert sorted(values(collect(client, f"{topic}-out", 200))) == sorted(
        f"m{i}!" for i in range(200)
    )
    code, stdout = run.interrupt(signal.SIGTERM)
    assert code == 0
    instances = json.loads(stdout)["instances"]
    assert [i["instanceId"] for i in instances] == [0, 1]
    assert sum(i["status"]["numSuccessfullyProcessed"] for i in instances) >= 200


def test_timeout_stops_a_runaway_invocation_and_the_instance_goes_on(
    localrun,
    client: pulsar.Client,
    topic: str,  # type: ignore[no-untyped-def]
) -> None:
    run = localrun(
        "--py",
        str(EXAMPLES / "slow.py"),
        "--name",
        "slow",
        "--inputs",
        topic,
        "--output",
        f"{topic}-out",
        "--timeout-ms",
        "300",
        "--processing-guarantees",
        "ATMOST_ONCE",
        "--subs-position",
        "Earliest",
        global_args=("--output", "json"),
    )
    run.wait_for_stderr("Running")
    produce(client, topic, ["hang", "after"])
    assert values(collect(client, f"{topic}-out", 1)) == ["after"]
    code, stdout = run.interrupt()
    assert code == 0
    status = json.loads(stdout)["instances"][0]["status"]
    assert status["numUserExceptions"] == 1
    assert (
        "ran longer than its timeout of 300 ms"
        in (status["latestUserExceptions"][0]["exceptionString"])
    )


def test_a_timeout_beyond_what_timers_can_wait_is_no_limit(
    localrun,
    client: pulsar.Client,
    topic: str,  # type: ignore[no-untyped-def]
) -> None:
    run = localrun(
        "--py",
        str(EXAMPLES / "exclamation.py"),
        "--classname",
        "exclamation.ExclamationFunction",
        "--name",
        "patient",
        "--inputs",
        topic,
        "--output",
        f"{topic}-out",
        "--timeout-ms",
        str(10**23),
        "--subs-position",
        "Earliest",
        global_args=("--output", "json"),
    )
    run.wait_for_stderr("Running")
    produce(client, topic, ["a", "b"])
    assert values(collect(client, f"{topic}-out", 2)) == ["a!", "b!"]
    code, stdout = run.interrupt()
    assert code == 0
    assert json.loads(stdout)["instances"][0]["status"]["numUserExceptions"] == 0


def test_embedded_broker_when_no_broker_url(
    localrun,
    cli_env: dict[str, str],
    topic: str,  # type: ignore[no-untyped-def]
) -> None:
    env = {k: v for k, v in cli_env.items() if k != "MAGNETAR_BROKER_URL"}
    run = localrun(
        "--py",
        str(EXAMPLES / "exclamation.py"),
        "--inputs",
        topic,
        "--output",
        f"{topic}-out",
        "--subs-position",
        "Earliest",
        env=env,
    )
    url = run.wait_for_stderr(r"Started the embedded broker at (pulsar://[\d.]+:\d+)").group(1)
    run.wait_for_stderr("Running")
    own = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        produce(own, topic, ["embedded"])
        assert values(collect(own, f"{topic}-out", 1)) == ["embedded!"]
    finally:
        own.close()
    code, _ = run.interrupt()
    assert code == 0


def test_function_config_file_with_flag_overrides(
    localrun,
    client: pulsar.Client,
    topic: str,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    config = tmp_path / "greeting.yaml"
    config.write_text(
        f"name: greeter\npy: {EXAMPLES / 'user_config.py'}\n"
        f"className: user_config.GreetingFunction\ninputs: [{topic}]\n"
        f"output: {topic}-out\nsubscriptionPosition: Earliest\n"
        "userConfig:\n  greeting: Hello\n"
    )
    run = localrun(
        "--function-config-file", str(config), "--user-config", '{"greeting": "Ahoy", "times": 1}'
    )
    run.wait_for_stderr("Running public/default/greeter")
    produce(client, topic, ["sailor"])
    assert values(collect(client, f"{topic}-out", 1)) == ["Ahoy, sailor"]
    assert run.interrupt()[0] == 0


@pytest.mark.parametrize(
    ("source", "classname", "expected"),
    [
        (None, None, r"function file .*missing\.py does not exist"),
        (
            "def process(input)\n    return input\n",
            None,
            r"syntax error in .*broken_fn\.py, line 1",
        ),
        (
            "import not_installed_dependency_xyz\n",
            None,
            r"No module named 'not_installed_dependency_xyz'",
        ),
        (
            "class Real:\n    def process(self, i, c):\n        return i\n",
            "Imaginary",
            r"has no class or function 'Imaginary'; it defines: Real",
        ),
    ],
)
def test_bad_function_code_is_reported_before_running(
    source: str | None,
    classname: str | None,
    expected: str,
    tmp_path: Path,
    cli_env: dict[str, str],
    topic: str,
) -> None:
    path = tmp_path / ("missing.py" if source is None else "broken_fn.py")
    if source is not None:
        path.write_text(source)
    args = ["--py", str(path), "--inputs", topic]
    if classname:
        args += ["--classname", classname]
    result = run_cli(args, cli_env)
    assert result.returncode == 1
    assert re.search(expected, result.stderr), result.stderr
    assert "Traceback" not in result.stderr


def test_invalid_config_and_unreachable_broker(cli_env: dict[str, str], topic: str) -> None:
    overlap = run_cli(
        ["--py", str(EXAMPLES / "exclamation.py"), "--inputs", topic, "--output", topic], cli_env
    )
    assert overlap.returncode == 1
    assert "is also an input topic" in overlap.stderr

    unreachable = run_cli(
        ["--py", str(EXAMPLES / "exclamation.py"), "--inputs", topic],
        {**cli_env, "MAGNETAR_BROKER_URL": "pulsar://127.0.0.1:1"},
    )
    assert unreachable.returncode == 1
    assert "cannot reach the Pulsar broker at pulsar://127.0.0.1:1" in unreachable.stderr

    bad_json = run_cli(
        ["--py", str(EXAMPLES / "exclamation.py"), "--inputs", topic, "--user-config", "{oops"],
        cli_env,
    )
    assert bad_json.returncode == 2
    assert "--user-config must be JSON" in bad_json.stderr


def test_second_ctrl_c_kills_a_function_stuck_in_user_code(
    localrun,
    client: pulsar.Client,
    topic: str,  # type: ignore[no-untyped-def]
) -> None:
    run = localrun(
        "--py",
        str(EXAMPLES / "slow.py"),
        "--name",
        "stuck",
        "--inputs",
        topic,
        "--subs-position",
        "Earliest",
        "--status-interval",
        "0.2",
    )
    run.wait_for_stderr(r"\n\s*0\s+yes\s")  # the instance runs (and can get stuck)
    produce(client, topic, ["hang"])
    time.sleep(1.0)
    run.process.send_signal(signal.SIGINT)
    time.sleep(0.5)
    started = time.monotonic()
    code, _ = run.interrupt(signal.SIGINT, timeout=20)
    assert time.monotonic() - started < 10
    assert code == 1
    assert "instance 0 failed" in run.stderr


@pytest.mark.parametrize(
    ("delay_s", "embedded"),
    [(0.2, False), (0.7, False), (1.5, False), (3.0, False), (0.4, True), (1.8, True)],
)
def test_ctrl_c_at_any_moment_stops_cleanly(
    localrun,  # type: ignore[no-untyped-def]
    cli_env: dict[str, str],
    topic: str,
    delay_s: float,
    embedded: bool,
) -> None:
    env = dict(cli_env)
    if embedded:
        env.pop("MAGNETAR_BROKER_URL")
    run = localrun(*exclamation(topic), "--parallelism", "2", env=env)
    time.sleep(delay_s)
    started = time.monotonic()
    code, _ = run.interrupt(signal.SIGINT, timeout=30)
    assert time.monotonic() - started < 15
    assert code == 0, run.stderr
    assert "Traceback" not in run.stderr and "KeyboardInterrupt" not in run.stderr, run.stderr


def test_pulsar_admin_flags_and_their_deprecated_spellings(
    localrun,  # type: ignore[no-untyped-def]
    client: pulsar.Client,
    cli_env: dict[str, str],
    broker_url: str,
    topic: str,
    tmp_path: Path,
) -> None:
    """A command line written for `pulsar-admin functions localrun`, camelCase flags and all."""
    source = tmp_path / "who.py"
    source.write_text(
        "def process(input, context):\n"
        "    return f\"{input}:{context.get_secret('TOKEN_NAME')}:{context.get_instance_id()}\"\n"
    )
    env = {k: v for k, v in cli_env.items() if k != "MAGNETAR_BROKER_URL"}
    env["TOKEN_NAME"] = "from-env"
    run = localrun(
        "--brokerServiceUrl",
        broker_url,
        "--fqfn",
        "public/default/who",
        "--py",
        str(source),
        "--className",
        "who",
        "--input-specs",
        json.dumps({topic: {"receiverQueueSize": 10}}),
        "--output",
        f"{topic}-out",
        "--processingGuarantees",
        "ATLEAST_ONCE",
        "--subs-position",
        "Earliest",
        "--secrets",
        '{"TOKEN_NAME": "ignored by the environment provider"}',
        "--secrets-provider-classname",
        "secretsprovider.EnvironmentBasedSecretsProvider",
        "--instance-id-offset",
        "5",
        "--cleanup-subscription",
        "false",
        "--web-service-url",
        "http://127.0.0.1:1",
        env=env,
    )
    run.wait_for_stderr("Running public/default/who")
    assert "--web-service-url: a Python function has no admin client" in run.stderr
    produce(client, topic, ["x"])
    assert values(collect(client, f"{topic}-out", 1)) == ["x:from-env:5"]
    assert run.interrupt()[0] == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--jar", "fn.jar"], "jar is set, but Magnetar runs Python (py) and JavaScript (js)"),
        (
            ["--windowLengthCount", "10", "--processing-guarantees", "MANUAL"],
            "Windows Function not support MANUAL delivery semantics.",
        ),
        (["--window-length-count", "0"], "Window length must be positive [0]"),
        (
            ["--window-length-count", "5", "--timestamp-extractor", "nosuch.Extractor"],
            "cannot load timestamp extractor 'nosuch.Extractor'",
        ),
        (["--producer-config", '{"compressionType": "BROTLI"}'], "must be one of NONE, LZ4"),
    ],
)
def test_flags_magnetar_cannot_honour_are_refused_with_the_reason(
    cli_env: dict[str, str], topic: str, args: list[str], expected: str
) -> None:
    result = run_cli(["--py", str(EXAMPLES / "exclamation.py"), "--inputs", topic, *args], cli_env)
    assert result.returncode == 1
    assert expected in result.stderr, result.stderr
