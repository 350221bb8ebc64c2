"""Scheduler scale: 10,000 instances (1,000 functions x parallelism 10) over 10 workers.

Times each scheduler, as the median of ``--repeat`` runs, in the five situations a leader
meets: from empty, a sticky re-schedule with nothing changed, after one worker died, the
first step after a new worker joined (least-loaded-sticky moves instances to it on its own,
one per function at a time) and a rebalance after a new worker joined. Also records how
many instances each moved and the spread of the resulting loads (max - min). The issue's
target is < 100 ms.

    python bench/scheduler_scale.py [--functions 1000] [--parallelism 10] [--workers 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from magnetar.worker.model import Assignment, instance_key
from magnetar.worker.scheduler import SCHEDULERS, Scheduler

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 100.0


@dataclass(frozen=True)
class Scenario:
    """One call of the scheduler: its input, and the assignment it starts from."""

    name: str
    current: Assignment
    workers: list[str]
    rebalance: bool = False


def scenarios(scheduler: Scheduler, instances: list[str], workers: list[str]) -> list[Scenario]:
    settled = scheduler.schedule(instances, {}, workers)
    return [
        Scenario("from_empty", {}, workers),
        Scenario("sticky_no_change", settled, workers),
        Scenario("worker_died", settled, workers[1:]),
        Scenario("step_after_join", settled, [*workers, "worker-joined"]),
        Scenario("rebalance_after_join", settled, [*workers, "worker-joined"], rebalance=True),
    ]


def median_ms(call: Callable[[], object], repeat: int) -> tuple[float, list[float]]:
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        runs.append((time.perf_counter() - started) * 1000)
    return statistics.median(runs), runs


def measure(
    scheduler: Scheduler, instances: list[str], scenario: Scenario, repeat: int
) -> dict[str, Any]:
    def call() -> Assignment:
        return scheduler.schedule(
            instances, scenario.current, scenario.workers, rebalance=scenario.rebalance
        )

    median, runs = median_ms(call, repeat)
    result = call()
    loads = Counter(result.values())
    per_worker = [loads[worker] for worker in scenario.workers]
    return {
        "median_ms": median,
        "runs_ms": runs,
        "moved": sum(1 for key, worker in scenario.current.items() if result[key] != worker),
        "load_spread": max(per_worker) - min(per_worker),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=1_000)
    parser.add_argument("--parallelism", type=int, default=10)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--output", default=str(ROOT / "bench" / "results" / "scheduler_scale.json")
    )
    args = parser.parse_args()

    instances = [
        instance_key(f"public/default/fn-{function:05d}", instance_id)
        for function in range(args.functions)
        for instance_id in range(args.parallelism)
    ]
    workers = [f"worker-{index:02d}" for index in range(args.workers)]
    results: dict[str, Any] = {
        "instances": len(instances),
        "functions": args.functions,
        "parallelism": args.parallelism,
        "workers": args.workers,
        "repeat": args.repeat,
        "target_ms": TARGET_MS,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "schedulers": {},
    }
    for name, scheduler_class in SCHEDULERS.items():
        scheduler = scheduler_class()
        results["schedulers"][name] = {
            scenario.name: measure(scheduler, instances, scenario, args.repeat)
            for scenario in scenarios(scheduler, instances, workers)
        }

    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2))
    print(f"{len(instances):,} instances over {args.workers} workers, median of {args.repeat}")
    print(f"\n{'scheduler':<22} {'scenario':<22} {'median ms':>10} {'moved':>7} {'spread':>7}")
    for name, by_scenario in results["schedulers"].items():
        for scenario_name, r in by_scenario.items():
            print(
                f"{name:<22} {scenario_name:<22} {r['median_ms']:>10.1f} "
                f"{r['moved']:>7,} {r['load_spread']:>7}"
            )
    print(f"\ntarget < {TARGET_MS:.0f} ms; written to {output}")


if __name__ == "__main__":
    main()
