"""A local Magnetar cluster: ``magnetar worker start`` processes sharing one broker.

The one place that starts, watches, kills and stops worker processes for the cluster tests,
the chaos test and the benchmarks. Each cluster has a system namespace of its own, so
clusters can share a broker; the REST helpers take the worker to ask first, as a client
picks the worker it talks to.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from magnetar.broker import find_free_port
from magnetar.testing.processes import descendants_named
from magnetar.worker.runtime import INSTANCE_PROCESS_NAME

__all__ = ["LocalCluster", "WorkerProcess", "wait_until"]

FUNCTIONS = "/admin/v3/functions/public/default"


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds it took for ``condition`` to hold (polled every 50 ms); AssertionError naming
    ``what`` if it does not within ``timeout``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout:.1f} s")
        time.sleep(0.05)
    return time.monotonic() - started


@dataclass
class WorkerProcess:
    """One ``magnetar worker start`` process and its log."""

    worker_id: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    args: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def instance_pids(self) -> list[int]:
        """The worker's running instance processes (forked by its fork server); warm ones
        waiting for an instance are not counted."""
        return descendants_named(self.process.pid, INSTANCE_PROCESS_NAME)

    def kill(self, with_instances: bool = False) -> list[int]:
        """kill -9 of the worker; ``with_instances`` kills its instance processes in the same
        instant, as when its machine dies. The instance pids killed."""
        instances = self.instance_pids() if with_instances else []
        for pid in instances:
            _kill(pid)
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        return instances


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


class LocalCluster:
    """Worker processes on one broker, in a system namespace of their own.

    ``env`` adds MAGNETAR_* settings for every worker; the liveness timeout defaults to 3 s
    so that failover is quick.
    """

    def __init__(
        self,
        broker_url: str,
        root: Path,
        env: dict[str, str] | None = None,
        liveness_timeout_s: float = 3.0,
    ) -> None:
        self.broker_url = broker_url
        self.root = root
        self.namespace = f"test{uuid.uuid4().hex[:6]}"
        self.workers: dict[str, WorkerProcess] = {}
        self.env = {"MAGNETAR_LIVENESS_TIMEOUT_S": f"{liveness_timeout_s:g}", **(env or {})}
        """Extra environment of every worker (MAGNETAR_* settings)."""

    def start_worker(
        self, worker_id: str, wait: bool = True, port: int | None = None
    ) -> WorkerProcess:
        port = port or find_free_port()
        log = self.root / f"{worker_id}.log"
        args = [
            *(sys.executable, "-m", "magnetar.cli", "--broker-url", self.broker_url),
            *("worker", "start", "--worker-id", worker_id, "--http-port", str(port)),
            *("--data-dir", str(self.root / worker_id)),
        ]
        env = {
            **os.environ,
            "MAGNETAR_SYSTEM_NAMESPACE": f"public/{self.namespace}",
            **self.env,
        }
        with log.open("ab") as out:
            process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        worker = WorkerProcess(worker_id, f"http://127.0.0.1:{port}", process, log, args)
        self.workers[worker_id] = worker
        if wait:
            self.wait_ready(worker)
        return worker

    def start(self, count: int, first: int = 1) -> list[WorkerProcess]:
        """``count`` workers named w1, w2, ... (from ``w{first}``), once all of them are in the
        membership."""
        # started side by side, as a deployment starts them; each is waited for afterwards
        workers = [self.start_worker(f"w{first + index}", wait=False) for index in range(count)]
        for worker in workers:
            self.wait_ready(worker)
        wait_until(
            lambda: len(self.get(workers[0], "/admin/v2/worker/cluster")) == count,
            20,
            f"all {count} workers in the membership",
        )
        return workers

    def restart(self, worker: WorkerProcess, wait: bool = True) -> WorkerProcess:
        """The same worker id on the same port and data directory."""
        return self.start_worker(worker.worker_id, wait=wait, port=worker.port)

    def wait_ready(self, worker: WorkerProcess, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not worker.alive():
                raise AssertionError(f"{worker.worker_id} exited:\n{worker.log_text()}")
            try:
                path = "/admin/v2/worker/cluster/leader/ready"
                if httpx.get(worker.url + path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{worker.worker_id} not ready:\n{worker.log_text()}")

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers.values() if w.alive()]

    def get(self, via: WorkerProcess, path: str) -> Any:
        response = httpx.get(via.url + path, timeout=10)
        response.raise_for_status()
        return response.json()

    def leader_id(self, via: WorkerProcess | None = None) -> str:
        via = via or self.alive()[0]
        return str(self.get(via, "/admin/v2/worker/cluster/leader")["workerId"])

    def assignments(self, via: WorkerProcess) -> dict[str, list[str]]:
        """Worker id -> the instances (``fqfn:index``) assigned to it."""
        result: dict[str, list[str]] = self.get(via, "/admin/v2/worker/assignments")
        return result

    def create(self, via: WorkerProcess, name: str, code: Path, **config: Any) -> httpx.Response:
        """Register function ``name`` (Pulsar's FunctionConfig fields) with its code file."""
        body = {"tenant": "public", "namespace": "default", "name": name, **config}
        return httpx.post(
            f"{via.url}{FUNCTIONS}/{name}",
            data={"functionConfig": json.dumps(body)},
            files={"data": (code.name, code.read_bytes())},
            timeout=30,
        )

    def status(self, via: WorkerProcess, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get(via, f"{FUNCTIONS}/{name}/status")
        return result

    def num_running(self, via: WorkerProcess, name: str) -> int:
        """How many instances of ``name`` run (-1 when ``via`` cannot say)."""
        try:
            return int(self.status(via, name)["numRunning"])
        except httpx.HTTPError:
            return -1

    def stop_all(self) -> None:
        """SIGTERM every worker (waking paused ones), SIGKILL those that do not stop."""
        for worker in self.alive():
            worker.process.send_signal(signal.SIGCONT)
            worker.process.terminate()
        for worker in self.workers.values():
            try:
                worker.process.wait(30)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
