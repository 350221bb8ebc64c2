"""Metadata replay: the cold start of a new worker in a cluster of 1,000 registered functions.

One worker (the *registrar*, on its own embedded broker unless ``--broker-url``, in a system
namespace of its own) registers ``--functions`` functions (parallelism 1, inputs distinct per
function, the exclamation example as code package) through its REST API, from a pool of
``--threads`` clients. No instance ever starts: the registrar drains itself before
registering, and stops each function once registered, so the new workers it is assigned to
start nothing (a thousand instance processes would swamp a small machine, and running
instances are not what this measures). The registrar's worker id sorts first, so it stays
the leader (the Failover subscription that elects it prefers the lowest consumer name): a
new worker only replays, it does not take the leadership over while being timed.

Then a NEW worker process is started ``--repeat`` times, each with a fresh data directory,
and timed from ``Popen`` until ``GET /admin/v2/worker/cluster/leader/ready`` answers 200:
it has replayed the metadata and assignments topics and knows the leader. The same is
measured before registering (no functions: the fixed cost of starting a worker), and the
baseline is a plain pulsar-client reader in a fresh process that reads the whole metadata
topic from the earliest message to the end. The issue's target: cold start < 3 s.

    python bench/metadata_replay.py [--functions 1000] [--repeat 3] [--threads 8]
                                    [--broker-url URL]
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
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pulsar
from _cluster import magnetar_processes_in_group, progress, wait_until

from magnetar.broker import EmbeddedBroker, find_free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "exclamation.py"
CLASS_NAME = "exclamation.ExclamationFunction"
TARGET_S = 3.0
READY_PATH = "/admin/v2/worker/cluster/leader/ready"
STALL_S = 2.0
"""How long the plain reader waits for a message before reopening (the worker's value)."""
# Worker ids: the registrar's sorts first, so it keeps the leadership.
REGISTRAR = "w0-registrar"
EMPTY = "w1-new-empty"
COLD = "w1-new"


def median_of(runs: list[dict[str, Any]], field: str) -> float:
    return float(statistics.median(run[field] for run in runs))


class Workers:
    """Starts ``magnetar worker start`` processes, each in a session of its own."""

    def __init__(self, broker_url: str, root: Path, namespace: str) -> None:
        self.broker_url = broker_url
        self.root = root
        base = {k: v for k, v in os.environ.items() if not k.startswith("MAGNETAR_")}
        # the registrar alone holds every function: past the default admission limit
        # of instances per worker (stopped instances count too)
        self.env = {
            **base,
            "MAGNETAR_SYSTEM_NAMESPACE": namespace,
            "MAGNETAR_MAX_INSTANCES_PER_WORKER": "1000000",
        }
        self.processes: list[subprocess.Popen[bytes]] = []
        self.http = httpx.Client(timeout=10)

    def start(self, worker_id: str) -> tuple[subprocess.Popen[bytes], str]:
        """Start a worker with an empty data directory; its process and admin URL."""
        port = find_free_port()
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
        with (self.root / f"{worker_id}.log").open("ab") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        self.processes.append(process)
        return process, f"http://127.0.0.1:{port}"

    def wait_ready(
        self, process: subprocess.Popen[bytes], url: str, timeout: float = 60.0
    ) -> tuple[float, float]:
        """Seconds until the REST API first answers, and until it answers ready."""
        started = time.perf_counter()
        first_answer: float | None = None

        def ready() -> bool:
            nonlocal first_answer
            if process.poll() is not None:
                raise RuntimeError(f"the worker at {url} exited; see the logs in {self.root}")
            try:
                code = self.http.get(url + READY_PATH, timeout=2).status_code
            except httpx.HTTPError:
                return False
            if first_answer is None:
                first_answer = time.perf_counter() - started
            return code == 200

        ready_s = wait_until(ready, timeout, f"the worker at {url} ready", poll=0.01)
        return (first_answer if first_answer is not None else ready_s), ready_s

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                self.stop(process)
            for pid in magnetar_processes_in_group(process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.http.close()


# --- registering ---------------------------------------------------------------------------


def register_all(
    http: httpx.Client, url: str, run_id: str, count: int, threads: int
) -> dict[str, Any]:
    """Register ``count`` functions in parallel; retried on transient errors."""
    code = EXAMPLE.read_bytes()
    done = 0
    retries = 0
    lock = threading.Lock()

    def register(index: int) -> None:
        nonlocal done, retries
        name = f"fn-{index:05d}"
        config = {
            "tenant": "public",
            "namespace": "default",
            "name": name,
            "className": CLASS_NAME,
            "inputs": [f"persistent://public/default/{run_id}-{name}-in"],
            "parallelism": 1,
        }
        for attempt in range(5):
            try:
                response = http.post(
                    f"{url}/admin/v3/functions/public/default/{name}",
                    data={"functionConfig": json.dumps(config)},
                    files={"data": (EXAMPLE.name, code)},
                    timeout=60,
                )
            except httpx.HTTPError as error:
                failure = str(error)
            else:
                # "already exists" after a retry: the earlier attempt went through after all
                exists = response.status_code == 400 and "already exists" in response.text
                if response.is_success or (exists and attempt):
                    # stopped, so the new workers it is assigned to start no instance of it
                    http.post(
                        f"{url}/admin/v3/functions/public/default/{name}/stop", timeout=60
                    ).raise_for_status()
                    break
                failure = f"{response.status_code} {response.text[:200]}"
            with lock:
                retries += 1
            time.sleep(0.5)
        else:
            raise RuntimeError(f"registering {name} failed: {failure}")
        with lock:
            done += 1
            if done % 100 == 0 or done == count:
                progress(f"  registered {done:,}/{count:,}")

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(register, range(count)))
    elapsed = time.perf_counter() - started
    return {
        "functions": count,
        "threads": threads,
        "seconds": elapsed,
        "per_second": count / elapsed,
        "retries": retries,
    }


# --- the measurements ----------------------------------------------------------------------


def cold_starts(workers: Workers, prefix: str, repeat: int, expected: int) -> list[dict[str, Any]]:
    """``repeat`` new workers, one at a time: Popen -> ready, then stopped."""
    runs = []
    for index in range(repeat):
        worker_id = f"{prefix}-{index}"
        process, url = workers.start(worker_id)
        try:
            http_up_s, ready_s = workers.wait_ready(process, url)
            listed = workers.http.get(f"{url}/admin/v3/functions/public/default").json()
        finally:
            workers.stop(process)
        if len(listed) != expected:
            raise RuntimeError(f"{worker_id} replayed {len(listed)} functions, not {expected}")
        runs.append(
            {
                "worker_id": worker_id,
                "http_up_s": http_up_s,
                "ready_s": ready_s,
                "functions": len(listed),
            }
        )
        progress(f"  {worker_id}: REST up {http_up_s:.3f} s, ready {ready_s:.3f} s")
    return runs


def read_topic(broker_url: str, topic: str, stall_s: float) -> dict[str, Any]:
    """In a fresh process: read ``topic`` from the earliest message to the end.

    A pulsar-lite reader sometimes stops delivering mid-topic; as the worker's tailer does,
    a read that waits ``stall_s`` reopens the reader after the last message read (counted
    in ``stalls``, with how many messages had been read; the wait is part of ``read_s``).
    Messages delivered again are skipped.
    """
    started = time.perf_counter()
    client = pulsar.Client(broker_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    last: Any = None
    count = size = 0
    stalled_at: list[int] = []
    while reader.has_message_available():
        try:
            message = reader.read_next(int(stall_s * 1000))
        except pulsar.Timeout:
            stalled_at.append(count)
            reader.close()
            reader = client.create_reader(topic, last or pulsar.MessageId.earliest)
            continue
        if last is not None and not last < message.message_id():
            continue
        last = message.message_id()
        count += 1
        size += len(message.data())
    read_s = time.perf_counter() - started
    reader.close()
    client.close()
    return {
        "messages": count,
        "bytes": size,
        "read_s": read_s,
        "stalls": len(stalled_at),
        "stalled_after_messages": stalled_at,
    }


def plain_reader_runs(broker_url: str, topic: str, repeat: int) -> list[dict[str, Any]]:
    runs = []
    for _ in range(repeat):
        command = [sys.executable, __file__, "--read-topic", topic, "--broker-url", broker_url]
        started = time.perf_counter()
        out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
        run = {**json.loads(out), "process_s": time.perf_counter() - started}
        runs.append(run)
        stalls = f", stalled after {run['stalled_after_messages']}" if run["stalls"] else ""
        progress(
            f"  plain reader: {run['messages']:,} messages in {run['read_s']:.3f} s "
            f"({run['process_s']:.3f} s with the interpreter{stalls})"
        )
    return runs


def import_seconds(repeat: int) -> list[float]:
    """A fresh interpreter importing the worker: the part of a cold start that is Python's."""
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import magnetar.worker.service"], check=True)
        runs.append(time.perf_counter() - started)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=8, help="parallel registrations")
    parser.add_argument("--broker-url")
    parser.add_argument(
        "--output", default=str(ROOT / "bench" / "results" / "metadata_replay.json")
    )
    parser.add_argument("--read-topic", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.read_topic:
        json.dump(read_topic(args.broker_url, args.read_topic, STALL_S), sys.stdout)
        return

    root = Path(tempfile.mkdtemp(prefix="magnetar-bench-replay-"))
    run_id = uuid.uuid4().hex[:6]
    namespace = f"public/replay{run_id}"
    broker = None
    workers = None
    try:
        url = args.broker_url
        if url is None:
            broker = EmbeddedBroker(root / "broker").start()
            url = broker.service_url
        workers = Workers(url, root, namespace)
        progress(f"starting the registrar on {url} (namespace {namespace})")
        registrar, registrar_url = workers.start(REGISTRAR)
        workers.wait_ready(registrar, registrar_url)
        workers.http.put(
            f"{registrar_url}/admin/v2/worker/leader/drain", params={"workerId": REGISTRAR}
        ).raise_for_status()

        progress("cold start with no functions:")
        empty = cold_starts(workers, EMPTY, args.repeat, 0)
        progress(f"registering {args.functions:,} functions ({args.threads} threads):")
        registration = register_all(
            workers.http, registrar_url, run_id, args.functions, args.threads
        )
        assigned = workers.http.get(f"{registrar_url}/admin/v2/worker/assignments").json()
        instances_assigned = sum(len(keys) for keys in assigned.values())
        if instances_assigned:
            raise RuntimeError(f"{instances_assigned} instances were assigned after all")
        progress(f"cold start with {args.functions:,} functions:")
        full = cold_starts(workers, COLD, args.repeat, args.functions)
        progress("baseline: a plain reader of the metadata topic:")
        topic = f"persistent://{namespace}/metadata"
        readers = plain_reader_runs(url, topic, args.repeat)
        imports = import_seconds(args.repeat)

        ready = median_of(full, "ready_s")
        results: dict[str, Any] = {
            "functions": args.functions,
            "repeat": args.repeat,
            "target_s": TARGET_S,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "broker": "embedded pulsar-lite, default settings" if broker else url,
            "metadata_topic": topic,
            "registration": registration,
            "instances_assigned": instances_assigned,
            "cold_start_no_functions": {
                "runs": empty,
                "ready_median_s": median_of(empty, "ready_s"),
                "http_up_median_s": median_of(empty, "http_up_s"),
            },
            "cold_start": {
                "runs": full,
                "ready_median_s": ready,
                "http_up_median_s": median_of(full, "http_up_s"),
            },
            "replay_cost_median_s": ready - median_of(empty, "ready_s"),
            "plain_reader": {
                "runs": readers,
                "read_median_s": median_of(readers, "read_s"),
                "process_median_s": median_of(readers, "process_s"),
                "stalls": sum(run["stalls"] for run in readers),
                "messages": readers[-1]["messages"],
                "bytes": readers[-1]["bytes"],
            },
            "import_worker_median_s": statistics.median(imports),
            "ratio_cold_start_vs_plain_reader_process": ready / median_of(readers, "process_s"),
            "meets_target": ready < TARGET_S,
        }
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2))
        print_table(results)
        print(f"\nwritten to {output}")
    finally:
        if workers is not None:
            workers.stop_all()
        if broker is not None:
            broker.stop()
        shutil.rmtree(root, ignore_errors=True)


def print_table(results: dict[str, Any]) -> None:
    reader = results["plain_reader"]
    registration = results["registration"]
    print(
        f"{results['functions']:,} functions registered in {registration['seconds']:.1f} s "
        f"({registration['per_second']:.0f}/s); metadata topic: {reader['messages']:,} "
        f"messages, {reader['bytes']:,} bytes; median of {results['repeat']}; "
        f"plain reader stalls: {reader['stalls']}"
    )
    rows = [
        ("new worker -> ready, no functions", results["cold_start_no_functions"]["ready_median_s"]),
        ("new worker -> ready (cold start)", results["cold_start"]["ready_median_s"]),
        ("  of which replay (difference)", results["replay_cost_median_s"]),
        ("plain reader, whole topic", reader["read_median_s"]),
        ("plain reader, with interpreter", reader["process_median_s"]),
        ("python: import the worker", results["import_worker_median_s"]),
    ]
    print(f"\n{'measure':<36} {'median s':>9}")
    for label, value in rows:
        print(f"{label:<36} {value:>9.3f}")
    print(
        f"\ncold start / plain reader process: "
        f"{results['ratio_cold_start_vs_plain_reader_process']:.2f}; "
        f"target < {results['target_s']:g} s: {'met' if results['meets_target'] else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
