"""The shared harness of the cluster benchmarks: ``magnetar worker start`` processes on one
broker, each in a session of its own, driven over REST; and the statistics they report."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from magnetar.broker import find_free_port

ROOT = Path(__file__).resolve().parent.parent
READY_PATH = "/admin/v2/worker/cluster/leader/ready"
FUNCTIONS = "/admin/v3/functions/public/default"
RETRIES = 50
"""Attempts of a change answered 503 (no leader at that moment), 0.1 s apart."""


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.02
) -> float:
    """Seconds until ``condition`` holds (checked every ``poll``); RuntimeError if never."""
    started = time.perf_counter()
    while not condition():
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        time.sleep(poll)
    return time.perf_counter() - started


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0.99: p99) of ``values``; None without any."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def p90(values: list[float]) -> float:
    """The 90th percentile (inclusive method: needs no more than one value)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def summary(values: list[float]) -> dict[str, Any]:
    return {"runs_s": values, "median_s": statistics.median(values), "p90_s": p90(values)}


def magnetar_processes_in_group(group: int) -> list[int]:
    """Pids of the Python processes still in process group ``group`` (a session started
    here), found through /proc so that no unrelated process is ever signalled. Instance
    processes count: the fork server's command line names the magnetar modules it preloads."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[2]) == group and (b"magnetar" in cmdline or b"spawn_main" in cmdline):
            found.append(int(entry.name))
    return found


@dataclass
class WorkerProcess:
    """One ``magnetar worker start`` process, in a session of its own."""

    worker_id: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None


class Cluster:
    """Worker processes on one broker and one system namespace, driven over REST."""

    def __init__(self, broker_url: str, root: Path, namespace: str, env: dict[str, str]) -> None:
        self.broker_url = broker_url
        self.root = root
        self.namespace = namespace
        # Only what the benchmark chooses: no MAGNETAR_* setting leaks in from outside.
        base = {k: v for k, v in os.environ.items() if not k.startswith("MAGNETAR_")}
        self.env = {**base, "MAGNETAR_SYSTEM_NAMESPACE": namespace, **env}
        self.workers: dict[str, WorkerProcess] = {}
        self.groups: list[int] = []
        """Process groups of every worker started, restarted ones included."""
        self.http = httpx.Client(timeout=10)

    def start_worker(self, worker_id: str, port: int | None = None) -> WorkerProcess:
        port = port or find_free_port()
        log = self.root / f"{worker_id}.log"
        command = [
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
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # its group holds its instances: cleaned up as one
            )
        worker = WorkerProcess(worker_id, port, process, log)
        self.workers[worker_id] = worker
        self.groups.append(process.pid)
        return worker

    def wait_ready(self, worker: WorkerProcess, timeout: float = 60.0) -> float:
        def ready() -> bool:
            if not worker.alive():
                raise RuntimeError(f"{worker.worker_id} exited; see {worker.log}")
            try:
                return self.http.get(worker.url + READY_PATH, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        return wait_until(ready, timeout, f"{worker.worker_id} ready")

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers.values() if w.alive()]

    def get(self, worker: WorkerProcess, path: str) -> Any:
        response = self.http.get(worker.url + path)
        response.raise_for_status()
        return response.json()

    def members(self, via: WorkerProcess) -> list[str]:
        return sorted(w["workerId"] for w in self.get(via, "/admin/v2/worker/cluster"))

    def leader_id(self, via: WorkerProcess) -> str:
        return str(self.get(via, "/admin/v2/worker/cluster/leader")["workerId"])

    def assignments(self, via: WorkerProcess) -> dict[str, list[str]]:
        result: dict[str, list[str]] = self.get(via, "/admin/v2/worker/assignments")
        return result

    def wait_members(self, via: WorkerProcess, count: int) -> float:
        def full() -> bool:
            try:
                return len(self.members(via)) == count
            except httpx.HTTPError:
                return False

        return wait_until(full, 60, f"{count} workers in the membership")

    def wait_leader_settled(self, via: WorkerProcess, quiet_s: float = 3.0) -> str:
        """The leader, once ``via`` has reported the same one for ``quiet_s`` (a rejoining
        worker may take the leadership over: a measurement must not start in the middle)."""
        leader, since = "", time.perf_counter()
        deadline = since + 60
        while time.perf_counter() < deadline:
            try:
                current = self.leader_id(via)
            except httpx.HTTPError:
                current = ""
            if current != leader:
                leader, since = current, time.perf_counter()
            elif leader and time.perf_counter() - since >= quiet_s:
                return leader
            time.sleep(0.1)
        raise RuntimeError("the leadership did not settle within 60 s")

    def send(self, method: str, url: str, what: str, done_before: int, **kwargs: Any) -> int:
        """Send until 200 (or ``done_before`` on a retry: the earlier attempt went through);
        503 (no leader at the moment: "retry in a moment") is retried. The retries made."""
        for attempt in range(RETRIES):
            response = self.http.request(method, url, timeout=30, **kwargs)
            if response.status_code in (200, 204) or (
                attempt and response.status_code == done_before
            ):
                return attempt
            if response.status_code != 503:
                break
            time.sleep(0.1)
        raise RuntimeError(f"{what} failed: {response.status_code} {response.text}")

    def register(
        self, via: WorkerProcess, name: str, code: Path, method: str = "POST", **config: Any
    ) -> int:
        """Create (POST) or update (PUT) a function through ``via``; the retries it took."""
        body = {"tenant": "public", "namespace": "default", "name": name, **config}
        return self.send(
            method,
            f"{via.url}{FUNCTIONS}/{name}",
            f"{method} {name}",
            409 if method == "POST" else 0,
            data={"functionConfig": json.dumps(body)},
            files={"data": (code.name, code.read_bytes())},
        )

    def delete(self, via: WorkerProcess, name: str) -> int:
        return self.send("DELETE", f"{via.url}{FUNCTIONS}/{name}", f"deleting {name}", 404)

    def status(self, via: WorkerProcess, name: str) -> dict[str, Any] | None:
        """The function's status; None when ``via`` cannot answer right now."""
        try:
            result: dict[str, Any] = self.get(via, f"{FUNCTIONS}/{name}/status")
        except httpx.HTTPError:
            return None
        return result

    def num_running(self, via: WorkerProcess, name: str) -> int:
        status = self.status(via, name)
        return -1 if status is None else int(status["numRunning"])

    def wait_unassigned(self, via: WorkerProcess, name: str) -> None:
        key = f"public/default/{name}:"
        wait_until(
            lambda: (
                not any(k.startswith(key) for keys in self.assignments(via).values() for k in keys)
            ),
            30,
            f"{name}: unassigned after delete",
        )

    def kill(self, worker: WorkerProcess) -> None:
        """kill -9 of the worker process alone (its instances notice and stop themselves)."""
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait(10)

    def stop_all(self) -> None:
        """SIGTERM every worker, then SIGKILL what is left of the process groups started
        here (instance processes orphaned by a kill -9 included)."""
        for worker in self.alive():
            worker.process.terminate()
        for worker in self.workers.values():
            try:
                worker.process.wait(30)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
        for group in self.groups:
            for pid in magnetar_processes_in_group(group):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.http.close()
