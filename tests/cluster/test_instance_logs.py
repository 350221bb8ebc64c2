"""An instance's log, as a user reads it: from any worker (the owner answers), and with
`magnetar functions logs`; never in the worker's own log."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import httpx
import pulsar

from tests.cluster.conftest import Cluster, Worker, wait_until
from tests.conftest import MAGNETAR

PRINTER = """
def process(input, context):
    print("printed", input)
    context.get_logger().warning("logged %s", input)
"""


def test_an_instance_log_is_read_through_any_worker_and_the_cli(
    cluster: Cluster, cluster_client: pulsar.Client, tmp_path: Path
) -> None:
    first, second = cluster.start(2)
    name, topic = f"printer-{uuid.uuid4().hex[:6]}", f"in-{uuid.uuid4().hex[:6]}"
    code = tmp_path / "printer.py"
    code.write_text(PRINTER)
    assert cluster.create(first, name, str(code), inputs=[topic]).status_code == 204
    wait_until(lambda: cluster.num_running(first, name) == 1, 30, "running")
    owner_id = cluster.status(first, name)["instances"][0]["status"]["workerId"]
    owner, other = (first, second) if owner_id == first.worker_id else (second, first)
    producer = cluster_client.create_producer(topic)
    for index in range(5):
        producer.send(f"m{index}".encode())
    producer.close()

    logs_path = f"/admin/v3/functions/public/default/{name}/0/logs"

    def log_via(worker: Worker, **params: str | int) -> httpx.Response:
        return httpx.get(f"{worker.url}{logs_path}", params=params, timeout=10)

    wait_until(lambda: "printed m4" in log_via(other).text, 30, "the prints in the log")
    answer = log_via(other)  # forwarded to the owner
    assert answer.status_code == 200
    assert "printed m0" in answer.text and "WARNING" in answer.text and "logged m4" in answer.text
    assert answer.text == log_via(owner).text
    last_two = log_via(other, lines=2).text.splitlines()
    assert len(last_two) == 2 and "m4" in last_two[-1]
    # a follower reads on from where the last answer ended
    offset = answer.headers["X-Log-Offset"]
    assert log_via(other, since=offset).text == ""
    producer = cluster_client.create_producer(topic)
    producer.send(b"m5")
    producer.close()
    wait_until(lambda: "printed m5" in log_via(other, since=offset).text, 30, "the next print")
    assert "printed m4" not in log_via(other, since=offset).text

    refused = httpx.get(other.url + logs_path.replace("/0/", "/3/"), timeout=10)
    assert refused.status_code == 400
    assert refused.json() == {"reason": f"Function {name} doesn't have instance with id 3"}

    shown = subprocess.run(
        [*MAGNETAR, "--admin-url", other.url, "functions", "logs", "--name", name, "--lines", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1].endswith("logged m5")
    # what the function printed is in its own log, not the worker's
    assert "printed m" not in owner.log_text() and "logged m" not in owner.log_text()
