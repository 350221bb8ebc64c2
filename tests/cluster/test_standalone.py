"""`magnetar standalone --workers 3`: the embedded broker and a working cluster, until Ctrl-C."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

import httpx

from magnetar.broker import find_free_port
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
