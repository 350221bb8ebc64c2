"""`magnetar standalone --workers 3`: the embedded broker and a working cluster, until Ctrl-C."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import pulsar

from magnetar.broker import find_free_port
from magnetar.cli.worker import BROKER_PORT, HTTP_PORT
from tests.cluster.conftest import wait_until
from tests.conftest import EXAMPLES, MAGNETAR


def test_standalone_runs_a_usable_cluster_and_stops_on_ctrl_c(tmp_path) -> None:  # type: ignore[no-untyped-def]
    port = free_ports(3)
    process = subprocess.Popen(
        [
            *MAGNETAR,
            "standalone",
            "--workers",
            "3",
            "--http-port",
            str(port),
            "--broker-port",
            str(find_free_port()),
            "--data-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    urls = [f"http://127.0.0.1:{port + i}" for i in range(3)]
    try:
        wait_until(lambda: all(ready(url) for url in urls), 60, "three workers ready")
        assert {w["workerId"] for w in httpx.get(f"{urls[0]}/admin/v2/worker/cluster").json()} == {
            "worker-1",
            "worker-2",
            "worker-3",
        }
        created = httpx.post(
            f"{urls[2]}/admin/v3/functions/public/default/hello",
            data={"functionConfig": json.dumps({"inputs": ["greetings"], "parallelism": 3})},
            files={"data": ("exclamation.py", (EXAMPLES / "exclamation.py").read_bytes())},
            timeout=30,
        )
        assert created.status_code == 204, created.text
        wait_until(
            lambda: (
                httpx.get(f"{urls[1]}/admin/v3/functions/public/default/hello/status").json()[
                    "numRunning"
                ]
                == 3
            ),
            15,
            "three instances running",
        )
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=90)
    assert process.returncode == 0, output
    assert "Magnetar standalone: broker pulsar://127.0.0.1:" in output
    assert "Stopping: finishing in-flight messages" in output


@contextmanager
def three_worker_standalone(data_dir: Path) -> Iterator[list[str]]:
    """``magnetar standalone --workers 3`` in ``data_dir``: its admin URLs once every worker is
    ready; stopped with Ctrl-C at the end."""
    port = free_ports(3)
    process = subprocess.Popen(
        [
            *MAGNETAR,
            "standalone",
            "--workers",
            "3",
            "--http-port",
            str(port),
            "--broker-port",
            str(find_free_port()),
            "--data-dir",
            str(data_dir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    urls = [f"http://127.0.0.1:{port + i}" for i in range(3)]
    try:
        wait_until(lambda: all(ready(url) for url in urls), 60, "three workers ready")
        yield urls
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(90)


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports."""
    port = find_free_port()
    while any(not _free(port + i) for i in range(count)):
        port = find_free_port()
    return port


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def ready(url: str) -> bool:
    """Whether the worker at ``url`` is ready."""
    try:
        return (
            httpx.get(f"{url}/admin/v2/worker/cluster/leader/ready", timeout=2).status_code == 200
        )
    except httpx.HTTPError:
        time.sleep(0.1)
        return False


@contextmanager
def taken(port: int) -> Iterator[None]:
    """Hold ``port`` (unless something else already does)."""
    with socket.socket() as sock:
        with suppress(OSError):
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield


def test_standalone_says_which_ports_it_picks_when_the_usual_ones_are_taken(
    tmp_path: Path,
) -> None:
    lines: list[str] = []
    with taken(BROKER_PORT), taken(HTTP_PORT):
        process = subprocess.Popen(
            [*MAGNETAR, "standalone", "--data-dir", str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert process.stdout is not None
        reader = threading.Thread(target=lambda: lines.extend(process.stdout or ()), daemon=True)
        reader.start()
        try:
            wait_until(lambda: any("Ctrl-C to stop" in line for line in lines), 60, "started")
            output = "".join(lines)
            broker = re.search(r"Port 6650 is taken, so the broker listens on (\S+):", output)
            admin = re.search(r"Port 8080 is taken, so worker-1's REST API is at (\S+):", output)
            assert broker and admin, output
            assert f"give commands --broker-url {broker[1]}" in output
            assert f"give commands --admin-url {admin[1]}" in output
            assert (
                f"Magnetar standalone: broker {broker[1]}, 1 worker, REST API {admin[1]}" in output
            )
            wait_until(lambda: ready(admin[1]), 30, "the worker ready at the port it named")
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(60)
            reader.join(10)
    output = "".join(lines)
    assert process.returncode == 0, output
    # a normal start says nothing alarming: the client library's expected errors are quiet
    assert "ERROR" not in output and "WARNING" not in output, output
    assert "getLastMessageId" not in output


STUCK = """
import time

def process(input):
    time.sleep(3600)
"""


def test_ctrl_c_stops_standalone_within_10_s_whatever_user_code_does(tmp_path: Path) -> None:
    port, broker_port = free_ports(3), find_free_port()
    process = subprocess.Popen(
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
            str(tmp_path / "data"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    status_url = f"{url}/admin/v3/functions/public/default/stuck/status"
    try:
        wait_until(lambda: all(ready(f"http://127.0.0.1:{port + i}") for i in range(3)), 60, "up")
        created = httpx.post(
            f"{url}/admin/v3/functions/public/default/stuck",
            data={"functionConfig": json.dumps({"inputs": ["naps"], "parallelism": 3})},
            files={"data": ("stuck.py", STUCK.encode())},
            timeout=30,
        )
        assert created.status_code == 204, created.text
        wait_until(lambda: httpx.get(status_url).json()["numRunning"] == 3, 30, "running")
        client = pulsar.Client(f"pulsar://127.0.0.1:{broker_port}")
        try:
            producer = client.create_producer("naps")
            for index in range(6):
                producer.send(f"nap-{index}".encode())
        finally:
            client.close()

        def asleep() -> int:
            instances = httpx.get(status_url).json()["instances"]
            return sum("in user code for" in instance["status"]["error"] for instance in instances)

        wait_until(lambda: asleep() >= 1, 30, "an instance asleep in user code")
    except BaseException:
        process.kill()
        raise
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    took = time.monotonic() - started
    assert took < 10, f"{took:.1f} s\n{output}"
    assert process.returncode == 0, output
