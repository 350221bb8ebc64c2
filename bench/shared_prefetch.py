"""A backlog drained by instances that share a subscription: how many messages each prefetches.

pulsar-lite reads and rewrites a Shared subscription's whole list of acknowledgement gaps on
every acknowledgement and dispatch, and what one consumer holds prefetched leaves gaps between
what the others acknowledge (``magnetar/instance/subscription.py``). So instances sharing a
subscription there prefetch 30 messages each instead of 1,000 (and acknowledge at once, in
both cases here: ``magnetar/instance/acks_at_once.py``). This measures a backlog of
``--messages`` unbatched inputs (each its own broker entry, as a stream's are) turned into
outputs by ``magnetar functions localrun`` of examples/exclamation.py at each
``--parallelism``:

* ``default``: the queue Magnetar chooses (30 a consumer on pulsar-lite at parallelism > 1);
* ``queue-1000``: ``inputSpecs`` ``receiverQueueSize`` 1,000 set by the user, the earlier
  default, in the same run.

Rates count from the first output to the last (start-up excluded), with the broker's CPU per
message; each case runs ``--repeat`` times, alternating, and the JSON holds every run and the
medians.

    python bench/shared_prefetch.py [--messages 60000] [--parallelism 1,3] [--repeat 3]
                                    [--broker lite|apache|both]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pulsar
from _brokers import Broker, add_broker_options, chosen, running
from _cluster import ROOT, progress

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
CASES = ("default", "queue-1000")
TICKS = os.sysconf("SC_CLK_TCK")


def broker_cpu_s() -> float:
    """CPU seconds spent so far by the broker processes on this machine (pulsar-lite, or
    Apache Pulsar's JVM)."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"pulsar-lite" in command or b"PulsarStandaloneStarter" in command:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
        except OSError:
            continue
    return total / TICKS


def drain(broker: Broker, messages: int, parallelism: int, case: str) -> dict[str, Any]:
    client = pulsar.Client(broker.service_url, logger=QUIET)
    try:
        source = f"prefetch-{uuid.uuid4().hex[:8]}"
        sink, name = f"{source}-out", f"drain-{uuid.uuid4().hex[:6]}"
        outputs = client.subscribe(
            sink, "bench", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5000
        )
        # the function's subscription exists first, so the backlog is kept for it
        client.subscribe(
            source, f"public/default/{name}", consumer_type=pulsar.ConsumerType.Shared
        ).close()
        producer = client.create_producer(
            source, batching_enabled=False, block_if_queue_full=True, max_pending_messages=20_000
        )
        for index in range(messages):
            producer.send_async(f"m{index}".encode(), None)
        producer.flush()
        command = [
            sys.executable, "-m", "magnetar.cli", "functions", "localrun",
            "--broker-service-url", broker.service_url,
            "--py", str(ROOT / "examples" / "exclamation.py"),
            "--classname", "exclamation.ExclamationFunction",
            "--inputs", source, "--output", sink, "--name", name,
            "--parallelism", str(parallelism),
        ]  # fmt: skip
        if case == "queue-1000":
            command += ["--input-specs", json.dumps({source: {"receiverQueueSize": 1000}})]
        run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            seen: set[bytes] = set()
            first_at = cpu_from = 0.0
            while len(seen) < messages:
                try:
                    message = outputs.receive(60_000)
                except pulsar.Timeout:
                    break
                outputs.acknowledge(message)
                if not seen:
                    first_at, cpu_from = time.monotonic(), broker_cpu_s()
                seen.add(message.data())
            elapsed = time.monotonic() - first_at
            return {
                "outputs": len(seen),
                "rate": round(len(seen) / elapsed) if seen else 0,
                "broker_us_per_message": round(1e6 * (broker_cpu_s() - cpu_from) / messages, 1),
            }
        finally:
            run.terminate()
            run.wait(30)
    finally:
        client.close()


def run_broker(broker: Broker, args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_no in range(args.repeat):
        for parallelism in args.parallelism:
            for case in CASES if parallelism > 1 else CASES[:1]:
                figures = drain(broker, args.messages, parallelism, case)
                runs.setdefault(f"p{parallelism} {case}", []).append(figures)
                progress(
                    f"  {broker.name} round {round_no + 1}/{args.repeat} parallelism "
                    f"{parallelism} {case:10} {figures['rate']:>7} msg/s  broker "
                    f"{figures['broker_us_per_message']} us/msg  outputs {figures['outputs']}"
                )
    medians = {
        key: {
            field: statistics.median(run[field] for run in values)
            for field in ("rate", "broker_us_per_message", "outputs")
        }
        for key, values in runs.items()
    }
    for parallelism in args.parallelism:
        if parallelism > 1:
            ours, theirs = medians[f"p{parallelism} default"], medians[f"p{parallelism} queue-1000"]
            ours["vs_queue_1000"] = round(ours["rate"] / max(theirs["rate"], 1), 2)
    return {"broker": broker.description, "runs": runs, "medians": medians}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--parallelism", default="1,3")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--output", type=Path, default=ROOT / "bench" / "results" / "shared_prefetch.json"
    )
    add_broker_options(parser, default="lite")
    args = parser.parse_args()
    args.parallelism = [int(p) for p in args.parallelism.split(",")]
    results: dict[str, Any] = {"benchmark": "shared_prefetch", "settings": {
        k: v for k, v in vars(args).items() if k != "output"
    }}  # fmt: skip
    for name in chosen(args):
        with running(name, args) as broker:
            results[name] = found = run_broker(broker, args)
        print(f"\n{broker.description}")
        print(f"{'case':18} {'msg/s':>8} {'broker us/msg':>14} {'outputs':>8}  x queue-1000")
        for key, row in found["medians"].items():
            print(
                f"{key:18} {row['rate']:>8.0f} {row['broker_us_per_message']:>14}"
                f" {row['outputs']:>8.0f}  {row.get('vs_queue_1000', '')}"
            )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
