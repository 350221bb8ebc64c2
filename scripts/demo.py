"""The Magnetar demo (`make demo`): an Apache Pulsar function, unchanged, on the embedded broker.

1. starts the embedded broker (pulsar-lite),
2. runs examples/exclamation.py -- a `pulsar.Function` written for Apache Pulsar -- with
   `magnetar functions localrun` and two instances,
3. produces messages with `magnetar topics produce` and a stream of 20,000 with pulsar-client,
4. reads the results back with `magnetar topics consume`,
5. stops the function with Ctrl-C (SIGINT) and shows its final status,
6. starts a three-worker cluster (`magnetar standalone --workers 3`), submits the same
   function to one worker through Pulsar's REST API and shows where its instances run,
7. runs examples/word_count.py on the cluster and queries its counters with
   `magnetar functions querystate`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pulsar

from magnetar.broker import EmbeddedBroker, find_free_port
from magnetar.cli.render import table

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
        cluster(Path(data_dir))
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


def cluster(data_dir: Path) -> None:
    step("A cluster: `magnetar standalone --workers 3` (the embedded broker and three workers)")
    port = free_ports(3)
    urls = [f"http://127.0.0.1:{port + i}" for i in range(3)]
    broker_port = find_free_port()
    standalone = subprocess.Popen(
        [
            *MAGNETAR,
            "standalone",
            "--workers",
            "3",
            "--http-port",
            str(port),
            "--broker-port",
            str(broker_port),
            "--data-dir",
            str(data_dir / "cluster"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait(lambda: all(ready(url) for url in urls), "the workers to be ready")
        leader = httpx.get(f"{urls[0]}/admin/v2/worker/cluster/leader").json()["workerId"]
        print(f"workers at {', '.join(urls)}; leader: {leader}")
        step("Submitting exclamation.py to worker-3 with parallelism 3 (REST, like Pulsar)")
        config = {"inputs": ["cluster-in"], "output": "cluster-out", "parallelism": 3}
        created = httpx.post(
            f"{urls[2]}/admin/v3/functions/public/default/exclamation",
            data={"functionConfig": json.dumps(config)},
            files={"data": ("exclamation.py", (EXAMPLES / "exclamation.py").read_bytes())},
            timeout=30,
        )
        created.raise_for_status()
        status_url = f"{urls[0]}/admin/v3/functions/public/default/exclamation/status"
        wait(lambda: httpx.get(status_url).json()["numRunning"] == 3, "three instances")
        rows = [
            (i["instanceId"], i["status"]["workerId"], "yes" if i["status"]["running"] else "no")
            for i in httpx.get(status_url).json()["instances"]
        ]
        print(table(("instance", "worker", "running"), rows))
        word_count(urls, f"pulsar://127.0.0.1:{broker_port}")
    finally:
        standalone.send_signal(signal.SIGINT)
        standalone.communicate(timeout=90)


WORDS = [
    "the quick brown fox jumps over the lazy dog",
    "state simply works in magnetar",
    "the counters live in a journal on the broker",
]


def word_count(urls: list[str], broker_url: str) -> None:
    """examples/word_count.py on the cluster; its counters queried with the CLI."""
    step("Word count with state: examples/word_count.py, parallelism 3, on the cluster")
    print((EXAMPLES / "word_count.py").read_text().split('"""', 2)[2].strip())
    config = {
        "inputs": ["sentences-wc"],
        "className": "word_count.WordCountFunction",
        "parallelism": 3,
        "subscriptionPosition": "Earliest",
    }
    created = httpx.post(
        f"{urls[0]}/admin/v3/functions/public/default/word_count",
        data={"functionConfig": json.dumps(config)},
        files={"data": ("word_count.py", (EXAMPLES / "word_count.py").read_bytes())},
        timeout=30,
    )
    created.raise_for_status()
    status_url = f"{urls[0]}/admin/v3/functions/public/default/word_count/status"
    wait(lambda: httpx.get(status_url).json()["numRunning"] == 3, "three word count instances")
    env = {**os.environ, "MAGNETAR_ADMIN_URL": urls[1]}
    rounds = 100
    print(f"producing {len(WORDS)} sentences x {rounds}")
    client = pulsar.Client(broker_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer("sentences-wc", batching_enabled=False)
    for _ in range(rounds):
        for sentence in WORDS:
            producer.send_async(sentence.encode(), None)
            time.sleep(0.001)
    producer.flush()
    client.close()
    state_url = f"{urls[1]}/admin/v3/functions/public/default/word_count/state/the"
    expected = 4 * rounds
    wait(
        lambda: httpx.get(state_url).json().get("numberValue") == expected,
        f"the count of 'the' to reach {expected}",
    )
    step("Querying the counters through the CLI, from another worker than the one created on")
    for word in ("the", "fox", "state"):
        magnetar("functions", "querystate", "--name", "word_count", "--key", word, env=env)
    magnetar(
        "--output",
        "json",
        "functions",
        "querystate",
        "--name",
        "word_count",
        "--key",
        "broker",
        env=env,
    )


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports."""
    while True:
        port = find_free_port()
        if all(port_is_free(port + i) for i in range(count)):
            return port


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/admin/v2/worker/cluster/leader/ready", timeout=2).is_success
    except httpx.HTTPError:
        return False


def wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.1)


if __name__ == "__main__":
    main()
