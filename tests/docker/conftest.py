"""The suite against a real Apache Pulsar: ``apachepulsar/pulsar`` in Docker (testcontainers).

Every test here is skipped, with the reason, when no Docker engine answers a ping, so
``make test`` passes on a machine without Docker; ``make test-docker`` sets
``MAGNETAR_REQUIRE_DOCKER=1``, which turns that skip into a failure.

The broker runs in a container; Magnetar workers run on the host as ``magnetar worker start``
processes, connected through the container's mapped ports. That tests the working tree's code
as it is (no image to rebuild per change), and "kill a worker" is a SIGKILL of a process the
test owns. Standalone Pulsar advertising a loopback address answers lookups with "connect
through the URL you dialled", so a mapped port works. The image, its health check and the
compose file are tested on their own by ``test_compose.py``.
"""

from __future__ import annotations

import json
import os
import shutil
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

from magnetar.broker import find_free_port
from tests.spark.conftest import spark  # noqa: F401  (the Spark session fixture, shared)

PULSAR_IMAGE = os.environ.get("PULSAR_IMAGE", "apachepulsar/pulsar:4.0.4")
"""The Apache Pulsar image the suite starts (the one docker-compose.yml uses by default)."""
STANDALONE = (
    "bin/pulsar standalone --no-functions-worker --no-stream-storage --advertised-address localhost"
)
_STARTUP_TIMEOUT_S = 240.0


def _docker_problem() -> str | None:
    """Why no Docker engine can be used here, or None when one answers a ping."""
    try:
        import docker

        client = docker.from_env(timeout=5)
    except Exception as error:  # the SDK raises DockerException, or OSError, or ...
        return f"no Docker engine is reachable ({error})"
    try:
        client.ping()
    except Exception as error:
        return f"the Docker engine does not answer a ping ({error})"
    finally:
        client.close()
    return None


def require(problem: str | None) -> None:
    """Skip (or, under ``make test-docker``, fail) the test when ``problem`` is not None."""
    if problem is None:
        return
    if os.environ.get("MAGNETAR_REQUIRE_DOCKER"):
        pytest.fail(f"make test-docker: {problem}", pytrace=False)
    pytest.skip(f"Docker suite skipped: {problem}; run `make test-docker` where Docker runs")


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """A Docker engine that answers; otherwise every test here is skipped with the reason."""
    require(_docker_problem())


@pytest.fixture(autouse=True)
def _needs_docker(docker_engine: None) -> None:
    """Every test in this directory needs the engine."""


@dataclass(frozen=True)
class PulsarBroker:
    """The container's broker as the host reaches it."""

    service_url: str
    """``pulsar://host:port`` (the mapped 6650)."""
    admin_url: str
    """``http://host:port`` (the mapped 8080)."""

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, self.admin_url + path, timeout=30, **kwargs)


@pytest.fixture(scope="session")
def pulsar_broker(docker_engine: None) -> Iterator[PulsarBroker]:
    """Apache Pulsar standalone in a container, once for the whole run."""
    from testcontainers.core.container import DockerContainer

    container = (
        DockerContainer(PULSAR_IMAGE, command=STANDALONE)
        .with_env("PULSAR_MEM", "-Xms512m -Xmx1g -XX:MaxDirectMemorySize=1g")
        .with_exposed_ports(6650, 8080)
    )
    container.start()
    try:
        host = container.get_container_host_ip()
        broker = PulsarBroker(
            f"pulsar://{host}:{container.get_exposed_port(6650)}",
            f"http://{host}:{container.get_exposed_port(8080)}",
        )
        _wait_until_serving(broker, container)
        yield broker
    finally:
        container.stop()


def _wait_until_serving(broker: PulsarBroker, container: Any) -> None:
    """Until the broker passes its own health check (a produce and consume) and has
    created public/default."""
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            health = broker.admin("GET", "/admin/v2/brokers/health")
            namespaces = broker.admin("GET", "/admin/v2/namespaces/public")
            if health.status_code == 200 and "public/default" in namespaces.text:
                return
            last = f"health {health.status_code} {health.text[:100]!r}"
        except httpx.HTTPError as error:
            last = f"{type(error).__name__}: {error}"
        time.sleep(1)
    logs = container.get_wrapped_container().logs(tail=200).decode(errors="replace")
    raise AssertionError(
        f"{PULSAR_IMAGE} did not serve within {_STARTUP_TIMEOUT_S:.0f} s ({last}):\n{logs}"
    )


@pytest.fixture(scope="session")
def pulsar_client(pulsar_broker: PulsarBroker) -> Iterator[pulsar.Client]:
    client = pulsar.Client(
        pulsar_broker.service_url,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        operation_timeout_seconds=30,
    )
    yield client
    client.close()


# --- Magnetar workers on the host ------------------------------------------------------------


@dataclass
class Worker:
    worker_id: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class HostCluster:
    """``magnetar worker start`` processes on one broker, with its admin URL, in a system
    namespace of their own (so every test also has the workers create one)."""

    broker: PulsarBroker
    root: Path
    system_namespace: str = field(default_factory=lambda: f"public/magnetar-{uuid.uuid4().hex[:8]}")
    workers: dict[str, Worker] = field(default_factory=dict)

    def start_worker(self, worker_id: str) -> Worker:
        port = find_free_port()
        log = self.root / f"{worker_id}.log"
        args = [
            *(sys.executable, "-m", "magnetar.cli", "--broker-url", self.broker.service_url),
            *("worker", "start", "--worker-id", worker_id, "--http-port", str(port)),
            *("--data-dir", str(self.root / worker_id)),
            *("--pulsar-admin-url", self.broker.admin_url),
        ]
        env = {
            **os.environ,
            "MAGNETAR_SYSTEM_NAMESPACE": self.system_namespace,
            "MAGNETAR_LIVENESS_TIMEOUT_S": "3",
        }
        with log.open("ab") as out:
            process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        worker = Worker(worker_id, f"http://127.0.0.1:{port}", process, log)
        self.workers[worker_id] = worker
        self.wait_ready(worker)
        return worker

    def start(self, count: int) -> list[Worker]:
        return [self.start_worker(f"worker-{index + 1}") for index in range(count)]

    def wait_ready(self, worker: Worker, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if worker.process.poll() is not None:
                raise AssertionError(f"{worker.worker_id} exited:\n{worker.log_text()}")
            try:
                ready = httpx.get(f"{worker.url}/admin/v2/worker/cluster/leader/ready", timeout=2)
                if ready.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{worker.worker_id} not ready:\n{worker.log_text()}")

    def alive(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.process.poll() is None]

    def get(self, path: str, via: Worker | None = None) -> Any:
        response = httpx.get((via or self.alive()[0]).url + path, timeout=30)
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text}"
        return response.json()

    def create(self, name: str, code: Path, via: Worker | None = None, **config: Any) -> None:
        """Register a function (Pulsar's FunctionConfig fields) with its code file."""
        body = {"tenant": "public", "namespace": "default", "name": name, **config}
        response = httpx.post(
            f"{(via or self.alive()[0]).url}/admin/v3/functions/public/default/{name}",
            data={"functionConfig": json.dumps(body)},
            files={"data": (code.name, code.read_bytes())},
            timeout=60,
        )
        assert response.status_code == 204, f"create {name}: {response.text}"

    def running_instances(self, name: str) -> int:
        status = self.get(f"/admin/v3/functions/public/default/{name}/status")
        return int(status["numRunning"])

    def kill(self, worker: Worker) -> None:
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait(10)

    def stop_all(self) -> None:
        for worker in self.alive():
            worker.process.terminate()
        for worker in self.workers.values():
            try:
                worker.process.wait(60)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()


@pytest.fixture
def host_cluster(pulsar_broker: PulsarBroker, tmp_path: Path) -> Iterator[HostCluster]:
    cluster = HostCluster(pulsar_broker, tmp_path)
    yield cluster
    cluster.stop_all()


# --- topics ----------------------------------------------------------------------------------


@pytest.fixture
def topic() -> str:
    """A fresh topic name in public/default; call sites add suffixes for more."""
    return f"docker-{uuid.uuid4().hex[:10]}"


def produce(client: pulsar.Client, topic: str, values: list[str], keyed: bool = False) -> None:
    """Send ``values`` unbatched (a key each with ``keyed``, which spreads them over the
    partitions of a partitioned topic) and wait until all are persisted."""
    producer = client.create_producer(
        f"persistent://public/default/{topic}", batching_enabled=False
    )
    try:
        for index, value in enumerate(values):
            if keyed:
                producer.send(value.encode(), partition_key=f"key-{index}")
            else:
                producer.send(value.encode())
    finally:
        producer.close()


def consume(
    client: pulsar.Client, topic: str, until: Callable[[list[Any]], bool], timeout: float = 60.0
) -> list[Any]:
    """Messages of ``topic`` from its start until ``until(messages)`` holds or the timeout."""
    consumer = client.subscribe(
        f"persistent://public/default/{topic}",
        f"test-{uuid.uuid4().hex[:8]}",
        initial_position=pulsar.InitialPosition.Earliest,
    )
    messages: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while not until(messages) and time.monotonic() < deadline:
            try:
                message = consumer.receive(500)
            except pulsar.Timeout:
                continue
            consumer.acknowledge(message)
            messages.append(message)
    finally:
        consumer.close()
    return messages


def texts(messages: list[Any]) -> list[str]:
    return [message.data().decode() for message in messages]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


def compose_problem() -> str | None:
    """Why ``docker compose`` cannot be run here, or None."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    result = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        return f"the docker compose plugin is not installed ({result.stderr.strip()})"
    return None
