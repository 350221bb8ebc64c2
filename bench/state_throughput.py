"""Counter increments through functions: the exclamation function with one ``incr_counter``
per message against the plain exclamation function, end to end, in the same run.

Both run as a Magnetar instance over the same number of 100-byte messages (a topic each),
alternating, ``--repeat`` times; the stateful one journals its counter updates, and its
inputs are acknowledged only once their journal records are persisted. Each run measures
its rate and its cost per message: the CPU time of this process (the instance's thread and
the client's I/O threads) plus, on the embedded broker, the broker's. On two shared cores
the rates swing by half from run to run, so the per-message CPU cost is the figure the
target is about (state adds at most 30%); the JSON holds every rate and cost, the medians
and both ratios. Then a query table materializes the journal and the counters are checked.

    python bench/state_throughput.py [--messages 50000] [--repeat 5] [--broker-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar
from _throughput import ROOT, fill, run_until_processed

from magnetar.broker import EmbeddedBroker
from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions
from magnetar.statestore import JournaledStateStore, StateOptions, StateQueryService

KEYS = 100

COUNTING = '''
from pulsar import Function


class CountingExclamation(Function):
    """The exclamation function, counting its inputs under one of 100 keys."""

    def __init__(self):
        self.n = 0

    def process(self, input, context):
        self.n += 1
        context.incr_counter(f"key-{self.n % 100}", 1)
        return input + "!"
'''


@dataclass
class Run:
    rate: float
    """Messages per second, subscribing and draining included."""
    client_us: float
    """CPU microseconds per message in this process."""
    broker_us: float
    """CPU microseconds per message in the embedded broker (0 on another broker)."""


def broker_cpu_s(pid: int | None) -> float:
    """CPU seconds the process has used so far (Linux /proc), 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_function(
    client: pulsar.Client,
    work: Path,
    stateful: bool,
    source: str,
    count: int,
    broker_pid: int | None,
) -> tuple[Run, str]:
    name = f"bench-{uuid.uuid4().hex[:6]}"
    if stateful:
        code, class_name = work / "counting.py", "counting.CountingExclamation"
    else:
        code, class_name = ROOT / "examples" / "exclamation.py", "exclamation.ExclamationFunction"
    config = FunctionConfig(
        name=name,
        py=str(code),
        class_name=class_name,
        inputs=[source],
        output=source + "-out",
        subscription_position="Earliest",
    )
    state = (
        JournaledStateStore(client, config.fqfn, StateOptions(str(work / name)))
        if stateful
        else None
    )
    cpu, broker = time.process_time(), broker_cpu_s(broker_pid)
    rate = run_until_processed(
        FunctionInstance(config, client, InstanceOptions(), state=state), count
    )
    run = Run(
        rate,
        (time.process_time() - cpu) / count * 1e6,
        (broker_cpu_s(broker_pid) - broker) / count * 1e6,
    )
    if state is not None:
        state.close()
    return run, config.fqfn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--broker-url")
    parser.add_argument(
        "--output", default=str(ROOT / "bench" / "results" / "state_throughput.json")
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="magnetar-bench-state-"))
    (work / "counting.py").write_text(COUNTING)
    broker = None
    try:
        url = args.broker_url
        if url is None:
            broker = EmbeddedBroker(work / "broker").start()
            url = broker.service_url
        broker_pid = broker.pid if broker is not None else None
        client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        runs: dict[str, list[Run]] = {"plain": [], "stateful": []}
        stateful_fqfns: list[str] = []
        print(f"  {'side':<9} {'msg/s':>10} {'client µs/msg':>14} {'broker µs/msg':>14}")
        for round_ in range(args.repeat):
            order = ["plain", "stateful"] if round_ % 2 == 0 else ["stateful", "plain"]
            for side in order:
                source = f"bench-state-in-{uuid.uuid4().hex[:8]}"
                fill(client, source, args.messages)
                run, fqfn = run_function(
                    client, work, side == "stateful", source, args.messages, broker_pid
                )
                runs[side].append(run)
                if side == "stateful":
                    stateful_fqfns.append(fqfn)
                print(
                    f"  {side:<9} {run.rate:>10,.0f} {run.client_us:>14.1f} {run.broker_us:>14.1f}",
                    file=sys.stderr,
                    flush=True,
                )
        queries = StateQueryService(client, work / "queries")
        counted = [
            sum(
                (entry.counter or 0)
                for entry in (queries.get(fqfn, f"key-{k}") for k in range(KEYS))
                if entry is not None
            )
            for fqfn in stateful_fqfns
        ]
        queries.stop()
        client.close()
        results = summarize(runs, args)
        results["counted_per_run"] = counted
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2))
        print(
            f"\nper message (medians): plain {results['plain_cost_us']:.1f} µs, with one "
            f"increment {results['stateful_cost_us']:.1f} µs of CPU (client + broker): state "
            f"adds {results['added_cost_per_message'] * 100:.0f}% (target <= 30%)\n"
            f"rates: plain {results['plain_median']:,.0f} msg/s, stateful "
            f"{results['stateful_median']:,.0f} msg/s: ratio {results['ratio']:.2f}"
        )
        print(f"counters summed per stateful run: {counted} (expected {args.messages} each)")
        print(f"written to {output}")
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)


def summarize(runs: dict[str, list[Run]], args: argparse.Namespace) -> dict[str, Any]:
    def median(side: str, field: str) -> float:
        return statistics.median(getattr(run, field) for run in runs[side])

    def cost(side: str) -> float:
        return statistics.median(run.client_us + run.broker_us for run in runs[side])

    plain, stateful = median("plain", "rate"), median("stateful", "rate")
    return {
        "messages": args.messages,
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "runs": {side: [vars(run) for run in side_runs] for side, side_runs in runs.items()},
        "plain_median": plain,
        "stateful_median": stateful,
        "ratio": stateful / plain,
        "plain_cost_us": cost("plain"),
        "stateful_cost_us": cost("stateful"),
        "added_cost_per_message": cost("stateful") / cost("plain") - 1,
    }


if __name__ == "__main__":
    main()
