"""The Magnetar demo (`make demo`): an Apache Pulsar function, unchanged, on the embedded broker.

1. starts the embedded broker (pulsar-lite),
2. runs examples/exclamation.py -- a `pulsar.Function` written for Apache Pulsar -- with
   `magnetar functions localrun` and two instances,
3. produces messages with `magnetar topics produce` and a stream of 20,000 with pulsar-client,
4. reads the results back with `magnetar topics consume`,
5. stops the function with Ctrl-C (SIGINT) and shows its final status.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pulsar

from magnetar.broker import EmbeddedBroker

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MAGNETAR = [sys.executable, "-m", "magnetar.cli"]
STREAM = 20_000


def step(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def magnetar(*args: str, env: dict[str, str]) -> str:
    print("$ magnetar " + shlex.join(args), flush=True)
    result = subprocess.run(
        [*MAGNETAR, *args], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    print(result.stdout.rstrip(), flush=True)
    return result.stdout


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="magnetar-demo-") as data_dir:
        step("Starting the embedded broker (pulsar-lite)")
        with EmbeddedBroker(data_dir) as broker:
            print(f"broker at {broker.service_url}")
            env = {**os.environ, "MAGNETAR_BROKER_URL": broker.service_url}
            run(env, broker.service_url)
    step("Done")


def run(env: dict[str, str], url: str) -> None:
    step("Running an Apache Pulsar function unchanged: examples/exclamation.py")
    print((EXAMPLES / "exclamation.py").read_text().split('"""', 2)[2].strip())
    args = [
        "functions",
        "localrun",
        "--py",
        str(EXAMPLES / "exclamation.py"),
        "--classname",
        "exclamation.ExclamationFunction",
        "--name",
        "exclamation",
        "--inputs",
        "sentences",
        "--output",
        "exclaimed",
        "--parallelism",
        "2",
        "--subs-position",
        "Earliest",
        "--status-interval",
        "2",
    ]
    print("$ magnetar " + shlex.join(args), flush=True)
    localrun = subprocess.Popen(
        [*MAGNETAR, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert localrun.stdout is not None
    for line in localrun.stdout:
        if line.startswith("Running"):
            print(line.rstrip(), flush=True)
            break
    else:
        raise SystemExit("localrun did not start")

    step("Producing three messages with the CLI")
    for text in ("hello pulsar", "functions in python", "no JVM needed"):
        magnetar("topics", "produce", "sentences", "-m", text, env=env)

    step("Reading the function's output")
    magnetar(
        "topics",
        "consume",
        "exclaimed",
        "-n",
        "3",
        "--subscription-position",
        "Earliest",
        "--timeout",
        "30",
        env=env,
    )

    step(f"Streaming {STREAM:,} more messages through the function")
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer("sentences", batching_enabled=True, block_if_queue_full=True)
    reader = client.subscribe(
        "exclaimed", "demo-counter", initial_position=pulsar.InitialPosition.Earliest
    )
    started = time.perf_counter()
    for i in range(STREAM):
        producer.send_async(f"message {i}".encode(), None)
    producer.flush()
    received = 0
    while received < STREAM + 3:
        reader.acknowledge(reader.receive(30_000))
        received += 1
        if received % 5000 == 0:
            print(f"  {received:>6,} outputs received", flush=True)
    elapsed = time.perf_counter() - started
    print(
        f"{STREAM:,} messages in and out in {elapsed:.1f} s "
        f"({STREAM / elapsed:,.0f} msg/s end to end, including producing them)"
    )
    client.close()

    step("Stopping the function with Ctrl-C: in-flight messages finish, then it exits")
    localrun.send_signal(signal.SIGINT)
    output, _ = localrun.communicate(timeout=60)
    tables = re.split(r"\n\s*\n", output.strip())
    print(tables[-1])
    if localrun.returncode != 0:
        raise SystemExit(f"localrun exited with {localrun.returncode}:\n{output}")


if __name__ == "__main__":
    main()
