"""A cluster of `magnetar worker start` processes on one broker: a pulsar-lite of their own, or
the session's Apache Pulsar (whose admin API the workers are given, as in production)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pulsar
import pytest

from magnetar.broker import EmbeddedBroker, find_free_port
from tests.conftest import EXAMPLES, KEEP_ALIVE_S, Broker, admin_url_of


@dataclass
class Worker:
    worker_id: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    args: list[str] = field(default_factory=list)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


class Cluster:
    """Worker processes sharing one broker; each test gets its own namespace of topics."""

    def __init__(self, broker_url: str, root: Path, env: dict[str, str] | None = None) -> None:
        self.broker_url = broker_url
        self.root = root
        self.workers: dict[str, Worker] = {}
        self.namespace = f"test{uuid.uuid4().hex[:6]}"
        self.env = env or {}
        """Extra environment of every worker (MAGNETAR_* settings)."""

    def start_worker(self, worker_id: str, wait: bool = True, port: int | None = None) -> Worker:
        port = port or find_free_port()
        log = self.root / f"{worker_id}.log"
        args = [
            sys.executable,
            "-m",
            "magnetar.cli",
            "--broker-url",
            self.broker_url,
            "worker",
            "start",
            "--worker-id",
            worker_id,
            "--http-port",
            str(port),
            "--data-dir",
            str(self.root / worker_id),
        ]
        env = {
            **os.environ,
            "MAGNETAR_SYSTEM_NAMESPACE": f"public/{self.namespace}",
            "MAGNETAR_LIVENESS_TIMEOUT_S": "3",
            **self.env,
        }
        with log.open("ab") as out:
            process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        worker = Worker(worker_id, f"http://127.0.0.1:{port}", process, log, args)
        self.workers[worker_id] = worker
        if wait:
            self.wait_ready(worker)
        return worker

    def restart(self, worker: Worker) -> Worker:
        return self.start_worker(worker.worker_id, port=int(worker.url.rsplit(":", 1)[1]))

    def wait_ready(self, worker: Worker, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if worker.process.poll() is not None:
                raise AssertionError(f"{worker.worker_id} exited:\n{worker.log_text()}")
            try:
                if (
                    httpx.get(
                        f"{worker.url}/admin/v2/worker/cluster/leader/ready", timeout=2
                    ).status_code
                    == 200
                ):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{worker.worker_id} not ready:\n{worker.log_text()}")

    def alive(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.process.poll() is None]

    def get(self, worker: Worker, path: str) -> Any:
        response = httpx.get(worker.url + path, timeout=10)
        response.raise_for_status()
        return response.json()

    def leader_id(self, via: Worker | None = None) -> str:
        via = via or self.alive()[0]
        return str(self.get(via, "/admin/v2/worker/cluster/leader")["workerId"])

    def create(
        self, worker: Worker, name: str, example: str = "exclamation.py", **config: Any
    ) -> httpx.Response:
        body = {"tenant": "public", "namespace": "default", "name": name, **config}
        code = (EXAMPLES / example).read_bytes()
        return httpx.post(
            f"{worker.url}/admin/v3/functions/public/default/{name}",
            data={"functionConfig": json.dumps(body)},
            files={"data": (example, code)},
            timeout=30,
        )

    def status(self, worker: Worker, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get(
            worker, f"/admin/v3/functions/public/default/{name}/status"
        )
        return result

    def assignments(self, worker: Worker) -> dict[str, list[str]]:
        result: dict[str, list[str]] = self.get(worker, "/admin/v2/worker/assignments")
        return result

    def stop_all(self) -> None:
        for worker in self.workers.values():
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGCONT)
                worker.process.terminate()
        for worker in self.workers.values():
            try:
                worker.process.wait(30)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()


@pytest.fixture(scope="session")
def cluster_broker(
    broker_kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Broker]:
    """A pulsar-lite of their own for the cluster tests, which kill and pause clients; or the
    session's Apache Pulsar."""
    if broker_kind == "apache":
        yield request.getfixturevalue("apache_pulsar")
        return
    with EmbeddedBroker(
        tmp_path_factory.mktemp("cluster-broker"), keep_alive_s=KEEP_ALIVE_S
    ) as broker:
        yield broker


def worker_env(broker: Broker) -> dict[str, str]:
    """The workers' settings for ``broker``: its admin API where it has one."""
    admin_url = admin_url_of(broker)
    return {"MAGNETAR_PULSAR_ADMIN_URL": admin_url} if admin_url else {}


@pytest.fixture
def cluster(cluster_broker: Broker, tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(cluster_broker.service_url, tmp_path, worker_env(cluster_broker))
    yield running
    running.stop_all()


@pytest.fixture(scope="session")
def cluster_client(cluster_broker: Broker) -> Iterator[pulsar.Client]:
    client = pulsar.Client(
        cluster_broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    yield client
    client.close()


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds it took for ``condition`` to hold; AssertionError naming ``what`` if not."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout:.1f} s")
        time.sleep(0.05)
    return time.monotonic() - started
