"""Cluster latency: create -> all instances running, and leader failover, on three workers.

Three ``magnetar worker start`` processes share one broker and a system namespace of their
own, with the default worker settings: only ``--liveness-timeout`` overrides one, and the JSON
records the value in force. Everything runs on a fresh embedded pulsar-lite, then on a fresh
Apache Pulsar standalone (whose admin API the workers are given), side by side in the JSON
(``--broker`` picks one; ``--broker-url`` a running broker).

* **create**: ``--repeat`` functions (distinct names, parallelism 3, the exclamation
  example), each created through a different worker in turn. Timed from the POST until the
  status reports 3 instances running, and until the first output for an input sent just
  before the create. Each function is deleted (and its instances gone) before the next.
  Baseline, alternating with it: one bare instance process, ``magnetar functions localrun``
  of the same function on the same broker, from ``Popen`` until it prints its "Running"
  line and until the first output for an input sent just before.
* **failover**: ``--failovers`` rounds of kill -9 of the leader while a parallelism-3
  function runs; timed until a surviving worker reports a new leader and until all 3
  instances run again. The killed worker is restarted and rejoins between rounds; a round
  kills the leader only once the leadership has been stable for 3 s.

The issue's targets: create -> running < 1 s median; failover < 5 s with default settings.

    python bench/cluster_latency.py [--repeat 7] [--failovers 5] [--liveness-timeout S]
                                    [--broker lite|apache|both] [--broker-url URL]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pulsar
from _brokers import Broker, add_broker_options, chosen, running, side_by_side

from magnetar.broker import find_free_port
from magnetar.client import create_client
from magnetar.worker.config import WorkerConfig

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "exclamation.py"
CLASS_NAME = "exclamation.ExclamationFunction"
PARALLELISM = 3
CREATE_TARGET_S = 1.0
FAILOVER_TARGET_S = 5.0
POLL_S = 0.02
RETRIES = 50
"""Attempts of a create or delete answered 503 (no leader at that moment), 0.1 s apart."""


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``condition`` holds (polled every ``POLL_S``); RuntimeError if never."""
    started = time.perf_counter()
    while not condition():
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        time.sleep(POLL_S)
    return time.perf_counter() - started


def p90(values: list[float]) -> float:
    """The 90th percentile (inclusive method: needs no more than one value)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def summary(values: list[float]) -> dict[str, Any]:
    return {"runs_s": values, "median_s": statistics.median(values), "p90_s": p90(values)}


def magnetar_processes_in_group(group: int) -> list[int]:
    """Pids of the Python processes still in process group ``group`` (a session started
    here), found through /proc so that no unrelated process is ever signalled."""
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
        # Only what this benchmark chooses: no MAGNETAR_* setting leaks in from outside.
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
                path = "/admin/v2/worker/cluster/leader/ready"
                return self.http.get(worker.url + path, timeout=2).status_code == 200
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

    def _retrying(self, send: Callable[[], httpx.Response], what: str, done_before: int) -> int:
        """Send until 200 (or ``done_before`` on a retry: the earlier attempt went through);
        503 (no leader at the moment: "retry in a moment") is retried. The retries made."""
        for attempt in range(RETRIES):
            response = send()
            if response.status_code == 200 or (attempt and response.status_code == done_before):
                return attempt
            if response.status_code != 503:
                break
            time.sleep(0.1)
        raise RuntimeError(f"{what} failed: {response.status_code} {response.text}")

    def create(self, via: WorkerProcess, name: str, **config: Any) -> int:
        """Register a function through ``via``; the retries it took."""
        body = {"tenant": "public", "namespace": "default", "name": name, **config}
        return self._retrying(
            lambda: self.http.post(
                f"{via.url}/admin/v3/functions/public/default/{name}",
                data={"functionConfig": json.dumps(body)},
                files={"data": (EXAMPLE.name, EXAMPLE.read_bytes())},
                timeout=30,
            ),
            f"creating {name}",
            409,
        )

    def delete(self, via: WorkerProcess, name: str) -> int:
        """Delete a function through ``via``; the retries it took."""
        return self._retrying(
            lambda: self.http.delete(f"{via.url}/admin/v3/functions/public/default/{name}"),
            f"deleting {name}",
            404,
        )

    def num_running(self, via: WorkerProcess, name: str) -> int:
        try:
            status = self.get(via, f"/admin/v3/functions/public/default/{name}/status")
        except httpx.HTTPError:
            return -1
        return int(status["numRunning"])

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


# --- create -> running -------------------------------------------------------------------


def topics(run_id: str, name: str) -> tuple[str, str]:
    return (
        f"persistent://public/default/{run_id}-{name}-in",
        f"persistent://public/default/{run_id}-{name}-out",
    )


def first_output_after(client: pulsar.Client, output: str) -> Any:
    """A consumer of ``output`` from its start, subscribed now (before anything runs)."""
    return client.subscribe(output, "bench", initial_position=pulsar.InitialPosition.Earliest)


def send_one(client: pulsar.Client, topic: str) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"hello")
    producer.close()


def output_delay(consumer: Any, started_wall: float, timeout_s: float = 30.0) -> float:
    """Seconds from ``started_wall`` (time.time()) until the first output was published."""
    message = consumer.receive(int(timeout_s * 1000))
    consumer.acknowledge(message)
    consumer.close()
    if message.data() != b"hello!":
        raise RuntimeError(f"unexpected output {message.data()!r}")
    return float(message.publish_timestamp()) / 1000 - started_wall


def measure_create(
    cluster: Cluster, client: pulsar.Client, via: WorkerProcess, run_id: str, name: str
) -> dict[str, Any]:
    source, sink = topics(run_id, name)
    consumer = first_output_after(client, sink)
    send_one(client, source)
    started_wall, started = time.time(), time.perf_counter()
    retries = cluster.create(
        via,
        name,
        className=CLASS_NAME,
        inputs=[source],
        output=sink,
        parallelism=PARALLELISM,
        subscriptionPosition="Earliest",
    )
    post_s = time.perf_counter() - started
    wait_until(lambda: cluster.num_running(via, name) == PARALLELISM, 30, f"{name}: all running")
    running_s = time.perf_counter() - started
    first_output_s = output_delay(consumer, started_wall)
    cluster.delete(via, name)
    key = f"public/default/{name}:"
    wait_until(
        lambda: (
            not any(k.startswith(key) for keys in cluster.assignments(via).values() for k in keys)
        ),
        30,
        f"{name}: unassigned after delete",
    )
    return {
        "name": name,
        "via": via.worker_id,
        "post_s": post_s,
        "post_retries_503": retries,
        "running_s": running_s,
        "first_output_s": first_output_s,
    }


def measure_localrun(
    broker_url: str, client: pulsar.Client, run_id: str, name: str
) -> dict[str, Any]:
    """One bare instance: ``magnetar functions localrun`` of the same function."""
    source, sink = topics(run_id, name)
    consumer = first_output_after(client, sink)
    send_one(client, source)
    command = [
        sys.executable,
        "-m",
        "magnetar.cli",
        "--broker-url",
        broker_url,
        "functions",
        "localrun",
        "--py",
        str(EXAMPLE),
        "--classname",
        CLASS_NAME,
        "--name",
        name,
        "-i",
        source,
        "-o",
        sink,
        "--subs-position",
        "Earliest",
    ]
    started_wall, started = time.time(), time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        assert process.stderr is not None
        running_s = None
        for line in process.stderr:
            if line.startswith(b"Running "):
                running_s = time.perf_counter() - started
                break
        if running_s is None:
            raise RuntimeError(f"localrun exited with {process.wait()} before running")
        first_output_s = output_delay(consumer, started_wall)
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
    return {"name": name, "running_line_s": running_s, "first_output_s": first_output_s}


def create_phase(
    cluster: Cluster, workers: list[WorkerProcess], broker_url: str, run_id: str, repeat: int
) -> dict[str, Any]:
    client = create_client(broker_url)
    cluster_runs: list[dict[str, Any]] = []
    localruns: list[dict[str, Any]] = []
    try:
        for round_ in range(repeat):
            order = ["cluster", "localrun"] if round_ % 2 == 0 else ["localrun", "cluster"]
            for side in order:
                if side == "cluster":
                    via = workers[round_ % len(workers)]
                    run = measure_create(cluster, client, via, run_id, f"create-{round_}")
                    cluster_runs.append(run)
                    retries = run["post_retries_503"]
                    note = f" ({retries} retries of the POST on 503)" if retries else ""
                    progress(
                        f"  create #{round_} via {via.worker_id}: all running in "
                        f"{run['running_s']:.3f} s, first output {run['first_output_s']:.3f} s"
                        f"{note}"
                    )
                else:
                    run = measure_localrun(broker_url, client, run_id, f"local-{round_}")
                    localruns.append(run)
                    progress(
                        f"  localrun #{round_}: 'Running' line {run['running_line_s']:.3f} s, "
                        f"first output {run['first_output_s']:.3f} s"
                    )
    finally:
        client.close()
    running = summary([r["running_s"] for r in cluster_runs])
    cluster_output = summary([r["first_output_s"] for r in cluster_runs])
    local_running = summary([r["running_line_s"] for r in localruns])
    local_output = summary([r["first_output_s"] for r in localruns])
    return {
        "parallelism": PARALLELISM,
        "repeat": repeat,
        "target_median_s": CREATE_TARGET_S,
        "cluster": {
            "runs": cluster_runs,
            "post": summary([r["post_s"] for r in cluster_runs]),
            "all_running": running,
            "first_output": cluster_output,
        },
        "localrun_baseline": {
            "runs": localruns,
            "running_line": local_running,
            "first_output": local_output,
        },
        "ratio_all_running_vs_localrun_running_line": running["median_s"]
        / local_running["median_s"],
        "ratio_first_output_vs_localrun_first_output": cluster_output["median_s"]
        / local_output["median_s"],
        "meets_target": running["median_s"] < CREATE_TARGET_S,
    }


# --- failover ----------------------------------------------------------------------------


def wait_full_membership(cluster: Cluster, via: WorkerProcess, count: int) -> float:
    def full() -> bool:
        try:
            return len(cluster.members(via)) == count
        except httpx.HTTPError:
            return False

    return wait_until(full, 60, f"{count} workers in the membership")


def wait_leader_settled(cluster: Cluster, via: WorkerProcess, quiet_s: float = 3.0) -> str:
    """The leader, once ``via`` has reported the same one for ``quiet_s`` (a rejoining
    worker may take the leadership over: the round must not start in the middle of it)."""
    leader, since = "", time.perf_counter()
    deadline = since + 60
    while time.perf_counter() < deadline:
        try:
            current = cluster.leader_id(via)
        except httpx.HTTPError:
            current = ""
        if current != leader:
            leader, since = current, time.perf_counter()
        elif leader and time.perf_counter() - since >= quiet_s:
            return leader
        time.sleep(0.1)
    raise RuntimeError("the leadership did not settle within 60 s")


def failover_round(cluster: Cluster, run_id: str, round_: int) -> dict[str, Any]:
    via = cluster.alive()[0]
    name = f"failover-{round_}"
    source, sink = topics(run_id, name)
    cluster.create(
        via, name, className=CLASS_NAME, inputs=[source], output=sink, parallelism=PARALLELISM
    )
    wait_until(lambda: cluster.num_running(via, name) == PARALLELISM, 30, f"{name}: running")
    leader_id = wait_leader_settled(cluster, via)
    on_leader = sum(1 for k in cluster.assignments(via).get(leader_id, []) if name in k)
    leader = cluster.workers[leader_id]
    observer = next(w for w in cluster.alive() if w.worker_id != leader_id)

    started = time.perf_counter()
    cluster.kill(leader)

    def new_leader() -> bool:
        try:
            return cluster.leader_id(observer) != leader_id
        except httpx.HTTPError:
            return False

    def all_running_elsewhere() -> bool:
        try:
            moved = leader_id not in cluster.assignments(observer)
        except httpx.HTTPError:
            return False
        return moved and cluster.num_running(observer, name) == PARALLELISM

    leader_s = wait_until(new_leader, 60, "a new leader")
    wait_until(all_running_elsewhere, 60, f"{name}: all running again")
    running_s = time.perf_counter() - started
    new_leader_id = cluster.leader_id(observer)
    progress(
        f"  failover #{round_}: killed leader {leader_id} ({on_leader} of the instances); "
        f"new leader {new_leader_id} after {leader_s:.3f} s, all running after {running_s:.3f} s"
    )

    # Clean up, then bring the killed worker back on its port and wait until it rejoins.
    cluster.delete(observer, name)
    restarted = cluster.start_worker(leader_id, port=leader.port)
    rejoin_s = cluster.wait_ready(restarted)
    wait_full_membership(cluster, observer, 3)
    return {
        "killed_leader": leader_id,
        "killed_leader_instances": on_leader,
        "new_leader": new_leader_id,
        "new_leader_s": leader_s,
        "all_running_s": running_s,
        "restarted_worker_ready_s": rejoin_s,
    }


def failover_phase(cluster: Cluster, run_id: str, rounds: int) -> dict[str, Any]:
    runs = [failover_round(cluster, run_id, round_) for round_ in range(rounds)]
    leader = summary([r["new_leader_s"] for r in runs])
    running = summary([r["all_running_s"] for r in runs])
    return {
        "rounds": rounds,
        "target_s": FAILOVER_TARGET_S,
        "runs": runs,
        "new_leader": leader,
        "all_running": running,
        "meets_target": running["median_s"] < FAILOVER_TARGET_S,
    }


# --- main --------------------------------------------------------------------------------


def settings(liveness_timeout: float | None) -> dict[str, Any]:
    fields = WorkerConfig.model_fields
    default_liveness = fields["liveness_timeout_s"].default
    return {
        "liveness_timeout_s": liveness_timeout or default_liveness,
        "liveness_timeout_is_default": liveness_timeout is None,
        "heartbeat_interval_s": fields["heartbeat_interval_s"].default,
        "scheduler": fields["scheduler"].default,
        "runtime": fields["runtime"].default,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="functions created (and localruns)")
    parser.add_argument("--failovers", type=int, default=5, help="kill -9 rounds of the leader")
    parser.add_argument(
        "--liveness-timeout",
        type=float,
        help="override the workers' liveness timeout (seconds) [default: the workers' own]",
    )
    add_broker_options(parser)
    parser.add_argument(
        "--output", default=str(ROOT / "bench" / "results" / "cluster_latency.json")
    )
    args = parser.parse_args()

    results: dict[str, Any] = {"brokers": {}}
    for name in chosen(args):
        with running(name, args) as broker:
            progress(f"== {name}: {broker.description}")
            results["brokers"][name] = measure(broker, args)
    for path in (
        ("create", "cluster", "all_running", "median_s"),
        ("create", "cluster", "first_output", "median_s"),
        ("failover", "new_leader", "median_s"),
        ("failover", "all_running", "median_s"),
    ):
        ratio = side_by_side(results["brokers"], path)
        if ratio is not None:
            results.setdefault("apache_over_lite", {})[".".join(path)] = ratio
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2))
    for name, measured in results["brokers"].items():
        print(f"\n{name}: {measured['broker']}")
        print_table(measured)
    print(f"\nwritten to {output}")


def measure(broker: Broker, args: argparse.Namespace) -> dict[str, Any]:
    """Both phases on three workers of ``broker`` (given its admin API, if it has one)."""
    root = Path(tempfile.mkdtemp(prefix="magnetar-bench-cluster-"))
    run_id = uuid.uuid4().hex[:6]
    cluster = None
    try:
        url = broker.service_url
        env = {}
        if args.liveness_timeout is not None:
            env["MAGNETAR_LIVENESS_TIMEOUT_S"] = str(args.liveness_timeout)
        if broker.admin_url:
            env["MAGNETAR_PULSAR_ADMIN_URL"] = broker.admin_url
        cluster = Cluster(url, root, f"public/bench{run_id}", env)
        progress(f"starting 3 workers on {url} (namespace {cluster.namespace})")
        started = time.perf_counter()
        workers = [cluster.start_worker(f"w{i}") for i in (1, 2, 3)]
        for worker in workers:
            cluster.wait_ready(worker)
        wait_full_membership(cluster, workers[0], 3)
        startup_s = time.perf_counter() - started
        wait_leader_settled(cluster, workers[0])
        results: dict[str, Any] = {
            "workers": 3,
            "settings": settings(args.liveness_timeout),
            "broker": broker.description,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "cluster_startup_s": startup_s,
            "definitions": {
                "cluster_startup": "Popen of the 3 workers -> all ready and in the membership",
                "running": "the status's numRunning: the instance process is alive",
                "first_output": "publish time of the output for an input sent before the start",
                "localrun_running_line": "localrun printed 'Running ...' (before subscribing)",
                "new_leader": "a surviving worker's GET /cluster/leader names another worker",
                "failover_all_running": "no instance on the killed worker, numRunning == 3",
            },
        }
        progress("create -> running (cluster) vs localrun (bare instance):")
        results["create"] = create_phase(cluster, workers, url, run_id, args.repeat)
        progress("failover (kill -9 of the leader):")
        results["failover"] = failover_phase(cluster, run_id, args.failovers)
        return results
    finally:
        if cluster is not None:
            cluster.stop_all()
        shutil.rmtree(root, ignore_errors=True)


def print_table(results: dict[str, Any]) -> None:
    create, failover = results["create"], results["failover"]
    local = create["localrun_baseline"]
    rows = [
        ("create -> all 3 running", create["cluster"]["all_running"], create["target_median_s"]),
        ("create -> first output", create["cluster"]["first_output"], None),
        ("localrun -> 'Running' line", local["running_line"], None),
        ("localrun -> first output", local["first_output"], None),
        ("kill leader -> new leader", failover["new_leader"], None),
        ("kill leader -> all running", failover["all_running"], failover["target_s"]),
    ]
    liveness = results["settings"]["liveness_timeout_s"]
    default = "default" if results["settings"]["liveness_timeout_is_default"] else "overridden"
    print(f"3 workers, parallelism {create['parallelism']}, liveness {liveness} s ({default})")
    print(f"\n{'measure':<28} {'median s':>9} {'p90 s':>7} {'target':>7}")
    for label, stats, target in rows:
        goal = f"< {target:g}" if target is not None else ""
        print(f"{label:<28} {stats['median_s']:>9.3f} {stats['p90_s']:>7.3f} {goal:>7}")
    print(
        f"\nratios of medians: all running / localrun 'Running' line "
        f"{create['ratio_all_running_vs_localrun_running_line']:.2f}; first output / localrun "
        f"first output {create['ratio_first_output_vs_localrun_first_output']:.2f}"
    )


if __name__ == "__main__":
    main()
