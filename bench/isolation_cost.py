"""What instance isolation costs: create latency and throughput of an instance a worker runs,
with ``instance_isolation`` off and on, in the same run.

Isolation (a worker running as root: each instance process as a uid of its own, in a
directory of its own, see ``magnetar.worker.isolation``) changes only how a worker starts an
instance process; ``bench/instance_throughput.py`` runs the instance inside the benchmark's
own process, so it cannot see it. Here two one-worker clusters share one broker, one with
isolation off and one with it on, and ``--repeat`` rounds alternate between them; each
round, on a new function (the exclamation example, parallelism 1):

* **create**: from the POST until the status shows the instance running;
* **first output**: until the output of an input sent before the create is stored;
* **throughput**: ``--messages`` 100-byte inputs sent before the create, from the first
  output until the status counts them all processed (``numSuccessfullyProcessed``, polled
  every 100 ms): messages per second.

The JSON holds every run, the medians and the on/off ratio of each median. On a loaded
machine those end-to-end figures vary by more than isolation costs, so the JSON also holds
what isolation adds, measured alone (``components``, 15 rounds in this process): claiming a
uid and the instance's directory, dropping privileges in a forked process (with the mount
namespace when Python is not reachable to others), and releasing the uid at the end.
Needs root (the worker isolates only then).

    python bench/isolation_cost.py [--messages 100000] [--repeat 3] [--broker lite|apache]
                                   [--no-memory-limits] [--no-network-limits]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pulsar
from _brokers import add_broker_options, chosen, running
from _cluster import ROOT, Cluster, WorkerProcess, progress, summary, wait_until
from _throughput import fill

from magnetar.instance.privileges import drop_privileges
from magnetar.worker.instance_network import remove_table
from magnetar.worker.isolation import InstanceIsolation

EXAMPLE = ROOT / "examples" / "exclamation.py"
MODES = {"off": "false", "on": "true"}


def one_round(
    cluster: Cluster, worker: WorkerProcess, client: pulsar.Client, messages: int
) -> dict[str, float]:
    """Create a function over ``messages`` waiting inputs; its create, first-output and
    throughput figures."""
    name = f"iso-{uuid.uuid4().hex[:8]}"
    source, sink = f"{name}-in", f"{name}-out"
    first = client.subscribe(sink, "bench", initial_position=pulsar.InitialPosition.Earliest)
    fill(client, source, messages)
    started = time.perf_counter()
    cluster.register(
        worker,
        name,
        EXAMPLE,
        className="exclamation.ExclamationFunction",
        inputs=[source],
        output=sink,
        subscriptionPosition="Earliest",
    )
    wait_until(lambda: cluster.num_running(worker, name) == 1, 60, f"{name} running")
    create_s = time.perf_counter() - started
    first.receive(60_000)
    first_output_s = time.perf_counter() - started
    first.close()

    def processed() -> int:
        status = cluster.status(worker, name)
        if status is None or not status["instances"]:
            return 0
        return int(status["instances"][0]["status"]["numSuccessfullyProcessed"])

    wait_until(lambda: processed() >= messages, 600, f"{name}: all processed", poll=0.1)
    rate = messages / (time.perf_counter() - started - first_output_s)
    cluster.delete(worker, name)
    return {"create_s": create_s, "first_output_s": first_output_s, "rate": rate}


def component_costs(rounds: int = 15) -> dict[str, Any]:
    """What isolation adds to an instance's start (claim, drop) and end (release), alone."""
    root = Path(tempfile.mkdtemp(prefix="magnetar-bench-isolation-parts-"))
    root.chmod(0o711)
    isolation = InstanceIsolation(root / "instances", range(470_000, 470_100), root / "locks")
    timings: dict[str, list[float]] = {"claim": [], "drop": [], "release": []}
    try:
        for index in range(rounds):
            started = time.perf_counter()
            user = isolation.claim(f"public/default/parts{index}", 0, EXAMPLE)
            timings["claim"].append(time.perf_counter() - started)
            read, write = os.pipe()
            child = os.fork()
            if child == 0:  # the forked child
                started = time.perf_counter()
                drop_privileges(user)
                os.write(write, repr(time.perf_counter() - started).encode())
                os._exit(0)
            os.waitpid(child, 0)
            timings["drop"].append(float(os.read(read, 100)))
            os.close(read)
            os.close(write)
            started = time.perf_counter()
            isolation.release(user.uid)
            timings["release"].append(time.perf_counter() - started)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {part: summary(values) for part, values in timings.items()}


def measure(service_url: str, admin_url: str | None, args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="magnetar-bench-isolation-"))
    clusters: dict[str, tuple[Cluster, WorkerProcess]] = {}
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    try:
        for mode, setting in MODES.items():
            env = {"MAGNETAR_INSTANCE_ISOLATION": setting}
            if args.no_memory_limits:
                env["MAGNETAR_INSTANCE_MEMORY_LIMITS"] = "false"
            if args.no_network_limits:
                env["MAGNETAR_INSTANCE_NETWORK_LIMITS"] = "false"
            if admin_url:
                env["MAGNETAR_PULSAR_ADMIN_URL"] = admin_url
            cluster = Cluster(
                service_url, root / mode, f"public/iso{mode}{uuid.uuid4().hex[:4]}", env
            )
            (root / mode).mkdir()
            worker = cluster.start_worker(f"iso-{mode}")
            cluster.wait_ready(worker)
            clusters[mode] = (cluster, worker)
        for index in range(args.repeat):
            order = list(MODES) if index % 2 == 0 else list(reversed(MODES))
            for mode in order:
                cluster, worker = clusters[mode]
                measured = one_round(cluster, worker, client, args.messages)
                runs[mode].append(measured)
                progress(f"round {index + 1}, isolation {mode}: {measured}")
    finally:
        client.close()
        for cluster, _ in clusters.values():
            cluster.stop_all()
        shutil.rmtree(root, ignore_errors=True)
    results: dict[str, Any] = {"runs": runs}
    for figure in ("create_s", "first_output_s", "rate"):
        medians = {mode: statistics.median(r[figure] for r in runs[mode]) for mode in MODES}
        results[figure] = {
            **{mode: summary([r[figure] for r in runs[mode]]) for mode in MODES},
            "on_over_off": medians["on"] / medians["off"],
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--no-memory-limits",
        action="store_true",
        help="the workers with instance_memory_limits off (no memory cgroups), to measure them",
    )
    parser.add_argument(
        "--no-network-limits",
        action="store_true",
        help="the workers with instance_network_limits off, and the host's table of rules for "
        "instance uids removed first (workers that start later write it again), to measure them",
    )
    add_broker_options(parser, default="lite")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "isolation.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("instance isolation needs a worker running as root: run this as root")
    if args.no_network_limits:
        remove_table()
    results: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "messages": args.messages,
        "brokers": {},
    }
    progress("isolation's parts, alone:")
    results["components"] = component_costs()
    for name in chosen(args):
        with running(name, args) as broker:
            progress(f"== {name}: {broker.description}")
            results["brokers"][name] = measure(broker.service_url, broker.admin_url, args)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2))
    print("isolation's parts, median ms:", end="")
    for part, timing in results["components"].items():
        print(f" {part} {timing['median_s'] * 1000:.1f}", end="")
    print()
    for name, measured in results["brokers"].items():
        print(f"\n{name}: median off / on (on/off)")
        for figure in ("create_s", "first_output_s", "rate"):
            row = measured[figure]
            print(
                f"  {figure:15} {row['off']['median_s']:10.3f} {row['on']['median_s']:10.3f}"
                f"  ({row['on_over_off']:.3f})"
            )
    print(f"\nwritten to {output}")


if __name__ == "__main__":
    main()
