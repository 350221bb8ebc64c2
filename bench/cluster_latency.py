"""Control-plane latency on three workers: create, update, start, restart, the CLI, failover.

Three ``magnetar worker start`` processes share one broker and a system namespace of their
own, with the default worker settings:
only ``--liveness-timeout`` overrides one, and the JSON records the value in force. The
function is the user_config example (parallelism 4), so an update is a visible change.

* **operations**, ``--repeat`` rounds, each on a new function created through another worker
  in turn, timed from the request until the status (polled every 20 ms) shows:
  create -> all 4 instances running (also: the first output, for an input sent before);
  update (a new userConfig) -> all 4 running anew (each a new process: ``numReceived`` back
  to 0 after every instance had received inputs); stop -> none running; start -> all 4
  running; restart -> all 4 running with ``numRestarts`` one higher. Then the function is
  deleted. The same rounds run on a second cluster whose workers keep no warm instance
  processes (``warm_instances=0``): the baseline of the warm pool, in the same run.
  Baseline of create, alternating with it: one bare instance process, ``magnetar functions
  localrun`` of the same function, from ``Popen`` to its "Running" line and first output.
* **cli**: ``magnetar functions list`` and ``functions status`` against a worker, ``--cli-runs``
  times each; baselines: the interpreter alone (``python -c pass``) and a bare Python HTTP
  GET of the same list (``urllib``), the floor of any Python command line.
* **failover**: ``--failovers`` rounds of kill -9 of the leader while a function runs; timed
  until a surviving worker reports a new leader and until all instances run again.

Targets (issue 15): create -> all running < 1 s; update, start, restart < 2 s; `functions
list` well under 0.5 s; failover < 5 s (medians).

Everything runs on a fresh embedded pulsar-lite, then on a fresh Apache Pulsar standalone
(whose admin API the workers are given), side by side in the JSON with Apache/lite ratios
(``--broker`` picks one; ``--broker-url`` a running broker).

    python bench/cluster_latency.py [--repeat 7] [--failovers 3] [--cli-runs 10]
                                    [--liveness-timeout S] [--broker lite|apache|both]
                                    [--broker-url URL] [--no-cold]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pulsar
from _brokers import Broker, add_broker_options, chosen, running, side_by_side
from _cluster import (
    FUNCTIONS,
    ROOT,
    Cluster,
    WorkerProcess,
    progress,
    summary,
    wait_until,
)

from magnetar.client import create_client
from magnetar.worker.config import WorkerConfig

EXAMPLE = ROOT / "examples" / "user_config.py"
CLASS_NAME = "user_config.GreetingFunction"
PARALLELISM = 4
TARGETS_S = {"create": 1.0, "update": 2.0, "start": 2.0, "restart": 2.0, "cli_list": 0.5}
FAILOVER_TARGET_S = 5.0
OPERATIONS = ("create", "update", "stop", "start", "restart")


# --- the operations ------------------------------------------------------------------------


def topics(run_id: str, name: str) -> tuple[str, str]:
    return (
        f"persistent://public/default/{run_id}-{name}-in",
        f"persistent://public/default/{run_id}-{name}-out",
    )


def send(client: pulsar.Client, topic: str, count: int = 1) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(count):
        producer.send(f"v{i}".encode())
    producer.close()


def output_delay(consumer: Any, started_wall: float, timeout_s: float = 30.0) -> float:
    """Seconds from ``started_wall`` (time.time()) until the first output was published."""
    message = consumer.receive(int(timeout_s * 1000))
    consumer.acknowledge(message)
    consumer.close()
    if not message.data().startswith(b"Hello, "):
        raise RuntimeError(f"unexpected output {message.data()!r}")
    return float(message.publish_timestamp()) / 1000 - started_wall


def instances(cluster: Cluster, via: WorkerProcess, name: str) -> list[dict[str, Any]]:
    """The instances' statuses, [] while ``via`` cannot answer."""
    status = cluster.status(via, name)
    return [] if status is None else [i["status"] for i in status["instances"]]


def all_instances(cluster: Cluster, via: WorkerProcess, name: str, test: Any) -> bool:
    found = instances(cluster, via, name)
    return len(found) == PARALLELISM and all(test(status) for status in found)


def timed(action: Any, done: Any, what: str) -> float:
    """Seconds from the start of ``action()`` until ``done()`` holds."""
    started = time.perf_counter()
    action()
    wait_until(done, 30, what)
    return time.perf_counter() - started


def operations_round(
    cluster: Cluster, client: pulsar.Client, via: WorkerProcess, run_id: str, name: str
) -> dict[str, Any]:
    """Create, update, stop, start and restart one function; then delete it."""
    source, sink = topics(run_id, name)
    config = {
        "className": CLASS_NAME,
        "inputs": [source],
        "output": sink,
        "parallelism": PARALLELISM,
        "subscriptionPosition": "Earliest",
        "userConfig": {"greeting": "Hello"},
    }
    consumer = client.subscribe(sink, "bench", initial_position=pulsar.InitialPosition.Earliest)
    send(client, source)
    started_wall = time.time()
    run: dict[str, Any] = {"name": name, "via": via.worker_id}
    run["create_s"] = timed(
        lambda: cluster.register(via, name, EXAMPLE, **config),
        lambda: cluster.num_running(via, name) == PARALLELISM,
        f"{name}: all running after create",
    )
    run["create_first_output_s"] = output_delay(consumer, started_wall)

    # Every instance processes inputs, so that a new process (received 0) is recognisable;
    # none is left in flight, so none is redelivered to a new process.
    sent = 1

    def every_instance_processed() -> bool:
        nonlocal sent
        found = instances(cluster, via, name)
        if len(found) == PARALLELISM and all(s["numReceived"] > 0 for s in found):
            return sum(s["numSuccessfullyProcessed"] for s in found) >= sent
        send(client, source, 8)
        sent += 8
        return False

    wait_until(every_instance_processed, 30, f"{name}: inputs on every instance", poll=0.2)
    config["userConfig"] = {"greeting": "Hi"}
    run["update_s"] = timed(
        lambda: cluster.register(via, name, EXAMPLE, method="PUT", **config),
        lambda: all_instances(cluster, via, name, lambda s: s["running"] and s["numReceived"] == 0),
        f"{name}: all running anew after update",
    )
    url = f"{via.url}{FUNCTIONS}/{name}"
    run["stop_s"] = timed(
        lambda: cluster.send("POST", f"{url}/stop", f"stopping {name}", 0),
        lambda: cluster.num_running(via, name) == 0,
        f"{name}: stopped",
    )
    run["start_s"] = timed(
        lambda: cluster.send("POST", f"{url}/start", f"starting {name}", 0),
        lambda: cluster.num_running(via, name) == PARALLELISM,
        f"{name}: all running after start",
    )
    before = {i: s["numRestarts"] for i, s in enumerate(instances(cluster, via, name))}
    run["restart_s"] = timed(
        lambda: cluster.send("POST", f"{url}/restart", f"restarting {name}", 0),
        lambda: (
            all_instances(cluster, via, name, lambda s: s["running"])
            and [s["numRestarts"] for s in instances(cluster, via, name)]
            == [before[i] + 1 for i in range(PARALLELISM)]
        ),
        f"{name}: all restarted",
    )
    cluster.delete(via, name)
    cluster.wait_unassigned(via, name)
    return run


def localrun_round(
    broker_url: str, client: pulsar.Client, run_id: str, name: str
) -> dict[str, Any]:
    """One bare instance: ``magnetar functions localrun`` of the same function."""
    source, sink = topics(run_id, name)
    consumer = client.subscribe(sink, "bench", initial_position=pulsar.InitialPosition.Earliest)
    send(client, source)
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


def operations_phase(
    cluster: Cluster,
    workers: list[WorkerProcess],
    run_id: str,
    repeat: int,
    label: str,
    localrun: bool,
) -> dict[str, Any]:
    client = create_client(cluster.broker_url)
    runs: list[dict[str, Any]] = []
    localruns: list[dict[str, Any]] = []
    try:
        for round_ in range(repeat):
            order = ["cluster", "localrun"] if round_ % 2 == 0 else ["localrun", "cluster"]
            for side in order:
                if side == "cluster":
                    via = workers[round_ % len(workers)]
                    run = operations_round(cluster, client, via, run_id, f"{label}-{round_}")
                    runs.append(run)
                    progress(
                        f"  {label} #{round_} via {via.worker_id}: "
                        + ", ".join(f"{op} {run[op + '_s']:.3f}" for op in OPERATIONS)
                        + f", first output {run['create_first_output_s']:.3f} s"
                    )
                elif localrun:
                    local = localrun_round(cluster.broker_url, client, run_id, f"local-{round_}")
                    localruns.append(local)
                    progress(
                        f"  localrun #{round_}: 'Running' line {local['running_line_s']:.3f} s, "
                        f"first output {local['first_output_s']:.3f} s"
                    )
    finally:
        client.close()
    result: dict[str, Any] = {"runs": runs}
    for op in OPERATIONS:
        result[op] = summary([r[op + "_s"] for r in runs])
    result["create_first_output"] = summary([r["create_first_output_s"] for r in runs])
    if localruns:
        result["localrun_baseline"] = {
            "runs": localruns,
            "running_line": summary([r["running_line_s"] for r in localruns]),
            "first_output": summary([r["first_output_s"] for r in localruns]),
        }
    return result


# --- the command line ----------------------------------------------------------------------


def command_seconds(command: list[str], runs: int, env: dict[str, str]) -> dict[str, Any]:
    """Wall seconds of ``command`` (which must succeed), ``runs`` times, as hyperfine does;
    and its CPU seconds (user + system), which a busy machine does not inflate as much."""
    wall, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, env=env, check=False)
        wall.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.decode()[-500:]}")
    return {**summary(wall), "cpu": summary(cpu)}


def cli_phase(cluster: Cluster, via: WorkerProcess, name: str, runs: int) -> dict[str, Any]:
    env = {**cluster.env, "MAGNETAR_ADMIN_URL": via.url}
    magnetar = [sys.executable, "-m", "magnetar.cli"]
    get = f"import urllib.request; urllib.request.urlopen('{via.url}{FUNCTIONS}').read()"
    result = {
        "functions_list": command_seconds([*magnetar, "functions", "list"], runs, env),
        "functions_status": command_seconds(
            [*magnetar, "functions", "status", "--name", name], runs, env
        ),
        "python_baseline": command_seconds([sys.executable, "-c", "pass"], runs, env),
        "urllib_get_baseline": command_seconds([sys.executable, "-c", get], runs, env),
    }
    listed, floor = result["functions_list"], result["urllib_get_baseline"]
    result["ratio_list_vs_urllib_get"] = listed["median_s"] / floor["median_s"]
    result["ratio_list_vs_urllib_get_cpu"] = listed["cpu"]["median_s"] / floor["cpu"]["median_s"]
    return result


# --- failover ------------------------------------------------------------------------------


def failover_round(cluster: Cluster, run_id: str, round_: int) -> dict[str, Any]:
    via = cluster.alive()[0]
    name = f"failover-{round_}"
    source, sink = topics(run_id, name)
    cluster.register(
        via,
        name,
        EXAMPLE,
        className=CLASS_NAME,
        inputs=[source],
        output=sink,
        parallelism=PARALLELISM,
    )
    wait_until(lambda: cluster.num_running(via, name) == PARALLELISM, 30, f"{name}: running")
    leader_id = cluster.wait_leader_settled(via)
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
    cluster.wait_members(observer, 3)
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
    running = summary([r["all_running_s"] for r in runs])
    return {
        "rounds": rounds,
        "target_s": FAILOVER_TARGET_S,
        "runs": runs,
        "new_leader": summary([r["new_leader_s"] for r in runs]),
        "all_running": running,
        "meets_target": running["median_s"] < FAILOVER_TARGET_S,
    }


# --- main ----------------------------------------------------------------------------------


def start_cluster(
    url: str, root: Path, run_id: str, label: str, env: dict[str, str]
) -> tuple[Cluster, list[WorkerProcess], float]:
    cluster = Cluster(url, root / label, f"public/bench{run_id}{label}", env)
    cluster.root.mkdir()
    progress(f"starting 3 workers ({label}) on {url} (namespace {cluster.namespace})")
    started = time.perf_counter()
    workers = [cluster.start_worker(f"w{i}") for i in (1, 2, 3)]
    for worker in workers:
        cluster.wait_ready(worker)
    cluster.wait_members(workers[0], 3)
    startup_s = time.perf_counter() - started
    cluster.wait_leader_settled(workers[0])
    return cluster, workers, startup_s


def settings(liveness_timeout: float | None) -> dict[str, Any]:
    fields = WorkerConfig.model_fields
    return {
        "liveness_timeout_s": liveness_timeout or fields["liveness_timeout_s"].default,
        "liveness_timeout_is_default": liveness_timeout is None,
        "heartbeat_interval_s": fields["heartbeat_interval_s"].default,
        "scheduler": fields["scheduler"].default,
        "runtime": fields["runtime"].default,
        "warm_instances": fields["warm_instances"].default,
    }


def targets(default: dict[str, Any], cli: dict[str, Any]) -> dict[str, Any]:
    medians = {op: default[op]["median_s"] for op in ("create", "update", "start", "restart")}
    medians["cli_list"] = cli["functions_list"]["median_s"]
    return {
        op: {"median_s": value, "target_s": TARGETS_S[op], "met": value < TARGETS_S[op]}
        for op, value in medians.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="rounds of operations")
    parser.add_argument("--failovers", type=int, default=3, help="kill -9 rounds of the leader")
    parser.add_argument("--cli-runs", type=int, default=10, help="runs of each CLI command")
    parser.add_argument(
        "--liveness-timeout",
        type=float,
        help="override the workers' liveness timeout (seconds) [default: the workers' own]",
    )
    add_broker_options(parser)
    parser.add_argument(
        "--no-cold", action="store_true", help="skip the cluster without warm processes"
    )
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
        ("operations", "create", "median_s"),
        ("operations", "update", "median_s"),
        ("operations", "restart", "median_s"),
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
    """Every phase on three workers of ``broker`` (given its admin API, if it has one)."""
    root = Path(tempfile.mkdtemp(prefix="magnetar-bench-cluster-"))
    run_id = uuid.uuid4().hex[:6]
    clusters: list[Cluster] = []
    env = {}
    if args.liveness_timeout is not None:
        env["MAGNETAR_LIVENESS_TIMEOUT_S"] = str(args.liveness_timeout)
    if broker.admin_url:
        env["MAGNETAR_PULSAR_ADMIN_URL"] = broker.admin_url
    url = broker.service_url
    try:
        cluster, workers, startup_s = start_cluster(url, root, run_id, "warm", env)
        clusters.append(cluster)
        results: dict[str, Any] = {
            "workers": 3,
            "parallelism": PARALLELISM,
            "settings": settings(args.liveness_timeout),
            "broker": broker.description,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg(),
            "cluster_startup_s": startup_s,
            "definitions": DEFINITIONS,
        }
        progress("operations (warm instance processes, the default):")
        warm = operations_phase(cluster, workers, run_id, args.repeat, "warm", localrun=True)
        results["operations"] = warm
        progress("command line:")
        cluster.register(workers[0], "cli", EXAMPLE, className=CLASS_NAME, inputs=["cli-in"])
        results["cli"] = cli_phase(cluster, workers[1], "cli", args.cli_runs)
        progress("failover (kill -9 of the leader):")
        results["failover"] = failover_phase(cluster, run_id, args.failovers)
        cluster.stop_all()
        if not args.no_cold:
            cold_env = {**env, "MAGNETAR_WARM_INSTANCES": "0"}
            cold, cold_workers, _ = start_cluster(url, root, run_id, "cold", cold_env)
            clusters.append(cold)
            progress("operations (no warm instance processes: the baseline):")
            results["operations_cold"] = operations_phase(
                cold, cold_workers, run_id, args.repeat, "cold", localrun=False
            )
            results["ratios_warm_vs_cold"] = {
                op: warm[op]["median_s"] / results["operations_cold"][op]["median_s"]
                for op in OPERATIONS
            }
        local = warm["localrun_baseline"]
        results["ratio_create_vs_localrun_running_line"] = (
            warm["create"]["median_s"] / local["running_line"]["median_s"]
        )
        results["ratio_first_output_vs_localrun"] = (
            warm["create_first_output"]["median_s"] / local["first_output"]["median_s"]
        )
        results["targets"] = targets(warm, results["cli"])
        return results
    finally:
        for each in clusters:
            each.stop_all()
        shutil.rmtree(root, ignore_errors=True)


DEFINITIONS = {
    "running": "the status's numRunning: the instance's consumers are subscribed",
    "create": "POST -> numRunning == 4",
    "update": "PUT (new userConfig) -> every instance running, numReceived 0",
    "stop": "POST stop -> numRunning == 0",
    "start": "POST start -> numRunning == 4",
    "restart": "POST restart -> every instance running, numRestarts + 1",
    "first_output": "publish time of the output for an input sent before the create",
    "localrun_running_line": "localrun printed 'Running ...' (before subscribing)",
    "cli": "wall time of the command in a fresh process, against a running worker",
    "failover_all_running": "no instance on the killed worker, numRunning == 4",
}


def print_table(results: dict[str, Any]) -> None:
    warm, cli = results["operations"], results["cli"]
    cold = results.get("operations_cold")
    local = warm["localrun_baseline"]
    print(
        f"3 workers, parallelism {results['parallelism']}, warm instances "
        f"{results['settings']['warm_instances']}, load average at start "
        f"{results['load_average_at_start'][0]:.1f}"
    )
    print(f"\n{'measure':<30} {'median s':>9} {'p90 s':>7} {'target':>7} {'cold med':>9}")
    for op in OPERATIONS:
        goal = f"< {TARGETS_S[op]:g}" if op in TARGETS_S else ""
        baseline = f"{cold[op]['median_s']:9.3f}" if cold else ""
        stats = warm[op]
        print(f"{op:<30} {stats['median_s']:>9.3f} {stats['p90_s']:>7.3f} {goal:>7} {baseline:>9}")
    rows = [
        ("create -> first output", warm["create_first_output"], None),
        ("localrun -> 'Running' line", local["running_line"], None),
        ("localrun -> first output", local["first_output"], None),
        ("cli: functions list", cli["functions_list"], TARGETS_S["cli_list"]),
        ("cli: functions status", cli["functions_status"], None),
        ("python -c pass", cli["python_baseline"], None),
        ("python urllib GET", cli["urllib_get_baseline"], None),
        ("kill leader -> new leader", results["failover"]["new_leader"], None),
        ("kill leader -> all running", results["failover"]["all_running"], FAILOVER_TARGET_S),
    ]
    for label, stats, target in rows:
        goal = f"< {target:g}" if target is not None else ""
        cpu = f"  (CPU {stats['cpu']['median_s']:.3f})" if "cpu" in stats else ""
        print(f"{label:<30} {stats['median_s']:>9.3f} {stats['p90_s']:>7.3f} {goal:>7}{cpu}")
    if cold:
        ratios = ", ".join(f"{op} {v:.2f}" for op, v in results["ratios_warm_vs_cold"].items())
        print(f"\nratios of medians, warm / cold: {ratios}")
    print(
        f"ratios of medians: create / localrun 'Running' line "
        f"{results['ratio_create_vs_localrun_running_line']:.2f}; first output / localrun "
        f"first output {results['ratio_first_output_vs_localrun']:.2f}; functions list / "
        f"urllib GET {cli['ratio_list_vs_urllib_get']:.2f} (CPU "
        f"{cli['ratio_list_vs_urllib_get_cpu']:.2f})"
    )
    met = ", ".join(f"{op} {'yes' if t['met'] else 'NO'}" for op, t in results["targets"].items())
    print(f"targets met: {met}")


if __name__ == "__main__":
    main()
