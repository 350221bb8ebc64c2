"""Counter increments through functions: the exclamation function with one ``incr_counter``
per message against the plain exclamation function, end to end, in the same run.

Both run as a Magnetar instance over the same number of 100-byte messages (a topic each),
alternating, ``--repeat`` times; the stateful one journals its counter updates, and its
inputs are acknowledged only once their journal records are persisted. The JSON holds every
rate, the medians, the ratio and the per-message cost state adds (target: at most 30%).
Then a query table materializes the journal and the counters are checked.

    python bench/state_throughput.py [--messages 50000] [--repeat 3] [--broker-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import uuid
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


def run_function(
    client: pulsar.Client, work: Path, stateful: bool, source: str, count: int
) -> tuple[float, str]:
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
    rate = run_until_processed(
        FunctionInstance(config, client, InstanceOptions(), state=state), count
    )
    if state is not None:
        state.close()
    return rate, config.fqfn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
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
        client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        rates: dict[str, list[float]] = {"plain": [], "stateful": []}
        stateful_fqfns: list[str] = []
        for round_ in range(args.repeat):
            order = ["plain", "stateful"] if round_ % 2 == 0 else ["stateful", "plain"]
            for side in order:
                source = f"bench-state-in-{uuid.uuid4().hex[:8]}"
                fill(client, source, args.messages)
                rate, fqfn = run_function(client, work, side == "stateful", source, args.messages)
                rates[side].append(rate)
                if side == "stateful":
                    stateful_fqfns.append(fqfn)
                print(f"  {side:<9} {rate:>10,.0f} msg/s", file=sys.stderr, flush=True)
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
        plain = statistics.median(rates["plain"])
        stateful = statistics.median(rates["stateful"])
        results: dict[str, Any] = {
            "messages": args.messages,
            "repeat": args.repeat,
            "cpus": os.cpu_count(),
            "plain_rates": rates["plain"],
            "stateful_rates": rates["stateful"],
            "plain_median": plain,
            "stateful_median": stateful,
            "ratio": stateful / plain,
            "added_cost_per_message": plain / stateful - 1,
            "counted_per_run": counted,
        }
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2))
        print(
            f"\nplain exclamation {plain:,.0f} msg/s, with one increment per message "
            f"{stateful:,.0f} msg/s: ratio {stateful / plain:.2f}, state adds "
            f"{(plain / stateful - 1) * 100:.0f}% per message (target <= 30%)"
        )
        print(f"counters summed per stateful run: {counted} (expected {args.messages} each)")
        print(f"written to {output}")
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
