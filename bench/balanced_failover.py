"""Balanced failover: a dead worker's instances spread, and it gets its share back.

Four ``magnetar worker start`` processes share one broker; two functions of parallelism 4
(the exclamation example) run under a steady stream into each. Every round kills -9 a
non-leader worker with its instance processes (its process group, as when its machine
dies), waits until its instances run elsewhere, restarts it, and waits until the loads are
even again. Rounds alternate between the two ways a returning worker gets its share:

* **automatic** (the candidate): the leader moves the fewest instances, at most one of a
  function at a time, the next once the moved one runs;
* **rebalance at once** (the baseline): ``PUT /admin/v2/worker/rebalance`` as soon as the
  worker is back, which moves the same instances in one go.

Per round: seconds until the dead worker's instances run elsewhere and the spread of the
loads then; seconds until the returning worker has its share; instances moved against the
fewest possible; the longest gap between two outputs of a function from the restart until
balanced + 2 s; whether the leader or its term changed. Medians per way, and their ratio.

    python bench/balanced_failover.py [--rounds 4] [--rate 100] [--broker-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pulsar
from _cluster import ROOT, Cluster, WorkerProcess, progress, wait_until

from magnetar.broker import EmbeddedBroker
from magnetar.testing.stream import Stream

WORKERS = 4
FUNCTIONS = ("alpha", "beta")
PARALLELISM = 4
EXAMPLE = ROOT / "examples" / "exclamation.py"
CLASS_NAME = "exclamation.ExclamationFunction"


def loads(cluster: Cluster, via: WorkerProcess) -> dict[str, int]:
    return {worker: len(keys) for worker, keys in cluster.assignments(via).items() if keys}


def owners(cluster: Cluster, via: WorkerProcess) -> dict[str, str]:
    return {k: worker for worker, keys in cluster.assignments(via).items() for k in keys}


def all_running(cluster: Cluster, via: WorkerProcess) -> bool:
    return all(cluster.num_running(via, name) == PARALLELISM for name in FUNCTIONS)


def terms_taken(cluster: Cluster) -> int:
    """How many times any worker took a term (its log says "leads term N")."""
    return sum(
        len(re.findall(r" leads term \d+$", worker.log.read_text(errors="replace"), re.M))
        for worker in cluster.workers.values()
    )


def kill_machine(worker: WorkerProcess) -> None:
    """kill -9 of the worker's process group: the worker and its instance processes."""
    os.killpg(worker.process.pid, signal.SIGKILL)
    worker.process.wait(10)


def fewest_moves(counts: list[int]) -> int:
    share, extra = divmod(sum(counts), len(counts))
    over = sorted((c for c in counts if c > share), reverse=True)
    return sum(c - share - 1 for c in over) + max(0, len(over) - extra)


def one_round(
    cluster: Cluster, streams: dict[str, Stream], round_: int, at_once: bool
) -> dict[str, Any]:
    via = cluster.alive()[0]
    leader = cluster.wait_leader_settled(via)
    terms_before = terms_taken(cluster)
    others = sorted(w for w in cluster.workers if w != leader)
    victim = cluster.workers[others[round_ % len(others)]]
    witness = cluster.workers[leader]

    started = time.perf_counter()
    kill_machine(victim)
    spread_s = wait_until(
        lambda: victim.worker_id not in loads(cluster, witness) and all_running(cluster, witness),
        60,
        "the dead worker's instances running elsewhere",
    )
    spread = loads(cluster, witness)
    before_return = owners(cluster, witness)

    restarted_wall, restarted = time.time(), time.perf_counter()
    cluster.start_worker(victim.worker_id, port=victim.port)
    cluster.wait_ready(cluster.workers[victim.worker_id])
    if at_once:
        cluster.http.put(f"{witness.url}/admin/v2/worker/rebalance").raise_for_status()

    def balanced() -> bool:
        counts = list(loads(cluster, witness).values())
        return len(counts) == WORKERS and max(counts) - min(counts) <= 1

    wait_until(lambda: balanced() and all_running(cluster, witness), 60, "an even spread")
    share_s = time.perf_counter() - restarted
    balanced_wall = time.time()
    after = owners(cluster, witness)
    moved = [key for key, worker in before_return.items() if after[key] != worker]
    time.sleep(2)
    gaps = {
        name: stream.longest_gap(restarted_wall, balanced_wall + 2)
        for name, stream in streams.items()
    }
    result = {
        "way": "rebalance_at_once" if at_once else "automatic",
        "killed": victim.worker_id,
        "dead_instances_running_elsewhere_s": spread_s,
        "loads_after_kill": spread,
        "spread_after_kill": max(spread.values()) - min(spread.values()),
        "returning_worker_has_its_share_s": share_s,
        "moved": len(moved),
        "moved_per_function": dict(Counter(key.rpartition(":")[0] for key in moved)),
        "fewest_moves": fewest_moves([*spread.values(), 0]),
        "longest_output_gap_s": max(gaps.values()),
        "leader_changed": cluster.leader_id(witness) != leader,
        "terms_taken": terms_taken(cluster) - terms_before,
        "round_s": time.perf_counter() - started,
    }
    progress(
        f"  round {round_} ({result['way']}): killed {victim.worker_id}; spread "
        f"{sorted(spread.values())} after {spread_s:.2f} s; share back after {share_s:.2f} s "
        f"moving {len(moved)} (fewest {result['fewest_moves']}); longest output gap "
        f"{result['longest_output_gap_s']:.2f} s; new terms {result['terms_taken']}"
    )
    return result


def summary(runs: list[dict[str, Any]], field: str) -> float:
    return statistics.median(run[field] for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="kill -9 rounds (alternating ways)")
    parser.add_argument("--rate", type=float, default=100.0, help="msg/s into each function")
    parser.add_argument("--broker-url")
    parser.add_argument(
        "--output", default=str(ROOT / "bench" / "results" / "balanced_failover.json")
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="magnetar-bench-balance-"))
    run_id = uuid.uuid4().hex[:6]
    broker = cluster = client = None
    try:
        url = args.broker_url
        if url is None:
            broker = EmbeddedBroker(root / "broker").start()
            url = broker.service_url
        cluster = Cluster(url, root, f"public/bench{run_id}", {})
        progress(f"starting {WORKERS} workers on {url}")
        workers = [cluster.start_worker(f"w{i}") for i in range(1, WORKERS + 1)]
        for worker in workers:
            cluster.wait_ready(worker)
        cluster.wait_members(workers[0], WORKERS)
        client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        streams = {}
        for name in FUNCTIONS:
            source = f"persistent://public/default/{run_id}-{name}-in"
            sink = f"persistent://public/default/{run_id}-{name}-out"
            cluster.register(
                workers[0],
                name,
                EXAMPLE,
                className=CLASS_NAME,
                inputs=[source],
                output=sink,
                parallelism=PARALLELISM,
                subscriptionPosition="Earliest",
            )
            streams[name] = Stream(client, source, sink, args.rate).start()
        wait_until(lambda: all_running(cluster, workers[0]), 60, "all instances running")
        progress(f"{len(FUNCTIONS)} functions of parallelism {PARALLELISM}, {args.rate} msg/s each")
        runs = [one_round(cluster, streams, r, at_once=r % 2 == 1) for r in range(args.rounds)]
        for stream in streams.values():
            stream.stop()
        missing: dict[str, int] = {}
        for name, stream in streams.items():
            stream.wait_complete(60)
            missing[name] = len(stream.missing())
            stream.close()
        ways: dict[str, Any] = {}
        for way in ("automatic", "rebalance_at_once"):
            mine = [run for run in runs if run["way"] == way]
            if mine:
                ways[way] = {
                    field: summary(mine, field)
                    for field in (
                        "dead_instances_running_elsewhere_s",
                        "returning_worker_has_its_share_s",
                        "longest_output_gap_s",
                        "moved",
                    )
                }
        results = {
            "workers": WORKERS,
            "functions": len(FUNCTIONS),
            "parallelism": PARALLELISM,
            "rate_per_function": args.rate,
            "broker": "embedded pulsar-lite, default settings" if broker else url,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "runs": runs,
            "medians": ways,
            "every_round_within_one_of_even": all(run["spread_after_kill"] <= 1 for run in runs),
            "every_return_with_the_fewest_moves": all(
                run["moved"] == run["fewest_moves"] for run in runs
            ),
            "leader_or_term_changed": any(
                run["leader_changed"] or run["terms_taken"] for run in runs
            ),
            "inputs_sent": {name: len(stream.sent) for name, stream in streams.items()},
            "inputs_without_output": missing,
        }
        if len(ways) == 2:
            auto, at_once = ways["automatic"], ways["rebalance_at_once"]
            results["ratios_automatic_vs_at_once"] = {
                field: auto[field] / at_once[field] if at_once[field] else None
                for field in ("returning_worker_has_its_share_s", "longest_output_gap_s")
            }
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2))
        print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=2))
        print(f"\nwritten to {output}")
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.stop_all()
        if broker is not None:
            broker.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
