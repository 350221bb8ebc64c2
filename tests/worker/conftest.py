"""Fixtures for the worker's tests: instance specs, started runtime managers, and workers
running in this process."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pulsar
import pytest

from magnetar.broker import find_free_port
from magnetar.instance import FunctionConfig
from magnetar.worker.config import WorkerConfig
from magnetar.worker.isolation import InstanceIsolation
from magnetar.worker.runtime import InstanceSpec, ProcessRuntime, Runtime
from magnetar.worker.runtime_manager import RuntimeManager
from magnetar.worker.service import WorkerService
from tests.conftest import EXAMPLES

WORKER_ID = "test-worker"

StartManager = Callable[..., RuntimeManager]


def function_config(example: str | None = None, **fields: Any) -> FunctionConfig:
    """A FunctionConfig (unique name, Earliest position); ``example`` names a file in examples/."""
    fields.setdefault("name", f"fn-{uuid.uuid4().hex[:8]}")
    fields.setdefault("subscription_position", "Earliest")
    if example:
        fields.setdefault("py", str(EXAMPLES / example))
    return FunctionConfig(**fields)


def instance_specs(config: FunctionConfig, version: int = 1) -> dict[str, InstanceSpec]:
    """The specs of every instance of ``config``, by instance key (what ``apply`` takes)."""
    specs = [InstanceSpec(config.fqfn, i, config, version) for i in range(config.parallelism)]
    return {spec.key: spec for spec in specs}


@pytest.fixture
def start_manager(broker_url: str) -> Iterator[StartManager]:
    """Start a RuntimeManager (process runtime unless ``runtime`` is given); stopped with
    drain at teardown, which must leave nothing running."""
    started: list[RuntimeManager] = []

    def start(runtime: Runtime | None = None, **kwargs: Any) -> RuntimeManager:
        manager = RuntimeManager(
            runtime or ProcessRuntime(broker_url, WORKER_ID), WORKER_ID, **kwargs
        )
        started.append(manager.start())
        return manager

    yield start
    for manager in started:
        manager.stop(drain=True)
    for manager in started:
        assert manager.wait(30), "the runtime manager did not stop within 30 s"


def isolation_in(
    tmp_path: Path, uids: range, directory: str = "w1", max_tasks: int = 1024
) -> InstanceIsolation:
    """Instance isolation handing out ``uids``, with its instances' directories in
    ``tmp_path / directory`` and its uid locks beside them (``tmp_path`` made searchable, as
    every directory above an instance's must be)."""
    tmp_path.chmod(0o711)
    return InstanceIsolation(
        tmp_path / directory, uids, locks=tmp_path / "locks", max_tasks=max_tasks
    )


def system_exceptions(manager: RuntimeManager, key: str, starting: str) -> list[str]:
    """What the status of instance ``key`` says went wrong outside user code, starting
    with ``starting`` (such as "out of memory"), newest last."""
    status = manager.status(key)
    assert status is not None
    return [
        e.exception_string
        for e in status.latest_system_exceptions
        if e.exception_string.startswith(starting)
    ]


def pid_exists(pid: int) -> bool:
    """Whether a process with this pid is running (an exited one, reaped or not, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        # an orphan's zombie lingers until init reaps it; the state follows the "(name)"
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except ProcessLookupError:  # it ended between the signal and the read
        return False
    except (FileNotFoundError, IndexError):
        return stat.parent.exists()


def receive_until(
    client: pulsar.Client,
    topic: str,
    expected: set[str],
    timeout: float = 15.0,
    subscription: str = "test-reader",
) -> list[str]:
    """Values from ``topic`` (acknowledged) until all of ``expected`` arrived or the timeout;
    duplicates (an at-least-once redelivery) are kept, so callers can check for losses."""
    consumer = client.subscribe(
        topic, subscription, initial_position=pulsar.InitialPosition.Earliest
    )
    received: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while not expected <= set(received):
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                break
            try:
                message = consumer.receive(remaining_ms)
            except pulsar.Timeout:
                break
            consumer.acknowledge(message)
            received.append(message.data().decode())
    finally:
        consumer.close()
    return received


class InProcessCluster:
    """Workers in this process (thread runtime) on the session broker, sharing a system
    namespace of their own: the REST API as a client sees it, with a leader to forward to."""

    def __init__(self, broker_url: str, root: Path, size: int = 2, **settings: Any) -> None:
        self.broker_url = broker_url
        self.root = root
        self.settings = {"system_namespace": f"public/t{uuid.uuid4().hex[:8]}", **settings}
        self.workers: list[WorkerService] = []
        for index in range(size):
            self.start_worker(f"w{index}")
        self.wait_ready()

    def start_worker(self, worker_id: str) -> WorkerService:
        config = WorkerConfig(
            worker_id=worker_id,
            broker_url=self.broker_url,
            http_port=find_free_port(),
            data_dir=self.root / worker_id,
            runtime="thread",
            **self.settings,
        )
        service = WorkerService(config).start()
        self.workers.append(service)
        return service

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(self._ready(w) for w in self.workers):
            assert time.monotonic() < deadline, "the workers did not become ready"
            time.sleep(0.05)

    @staticmethod
    def _ready(worker: WorkerService) -> bool:
        url = worker.config.admin_url + "/admin/v2/worker/cluster/leader/ready"
        return httpx.get(url, timeout=5).status_code == 200

    def url(self, role: str) -> str:
        """The admin URL of the ``leader`` or of a ``follower``."""
        leader = httpx.get(
            self.workers[0].config.admin_url + "/admin/v2/worker/cluster/leader", timeout=5
        ).json()["workerId"]
        chosen = [w for w in self.workers if (w.config.worker_id == leader) == (role == "leader")]
        return chosen[0].config.admin_url

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop(drain=False)
        self.workers.clear()


@pytest.fixture(scope="module")
def rest_cluster(
    broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessCluster]:
    """Two in-process workers for one test module."""
    cluster = InProcessCluster(broker_url, tmp_path_factory.mktemp("rest"), request_timeout_s=4)
    yield cluster
    cluster.stop()
