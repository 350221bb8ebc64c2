"""The shared harness of the throughput benchmarks: two sides over the same number of
100-byte messages, alternating ``--repeat`` times in one run, unpinned and pinned to one core
(``taskset -c 1``), each mode in a fresh process; the JSON holds every rate, the medians and
the ratio of medians (candidate / baseline), and beside them the CPU each side's process
spent per message (every thread of it; the broker's excluded) with the ratio baseline /
candidate: how much work a message costs each side, where the rates also say how the cores
were shared with the broker and whatever else ran."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulsar
from _brokers import add_broker_options, chosen, running, side_by_side

from magnetar.instance import FunctionInstance

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = b"x" * 100

Side = Callable[[pulsar.Client, str, str, int], float]
"""Processes ``count`` messages from a source topic into a sink topic: messages per second."""


def fill(client: pulsar.Client, topic: str, count: int) -> None:
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_publish_delay_ms=10,
        block_if_queue_full=True,
        max_pending_messages=10_000,
    )
    for _ in range(count):
        producer.send_async(PAYLOAD, None)
    producer.flush()
    producer.close()


def run_until_processed(
    instance: FunctionInstance, count: int, from_first_message: bool = False
) -> float:
    """Run ``instance`` on this thread until it has processed ``count`` messages and stopped
    gracefully: messages per second, subscribing included unless ``from_first_message`` (the
    steady rate, for sides too slow for ``count`` to hide a second of start-up)."""
    started = time.perf_counter()

    def stop_when_done() -> None:
        nonlocal started
        if from_first_message:
            while instance.metrics.received == 0:
                time.sleep(0.001)
            started = time.perf_counter()
        while instance.metrics.processed < count:
            time.sleep(0.005)
        instance.stop(drain=True)

    watcher = threading.Thread(target=stop_when_done, daemon=True)
    watcher.start()
    instance.run()
    return count / (time.perf_counter() - started)


def _phase(broker_url: str, messages: int, repeat: int, sides: dict[str, Side]) -> Any:
    """Run every side ``repeat`` times, alternating the order, in this process."""
    client = pulsar.Client(broker_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    rates: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(repeat):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for name in order:
            source = f"bench-in-{uuid.uuid4().hex[:8]}"
            fill(client, source, messages)
            cpu_before = time.process_time()
            rate = sides[name](client, source, source + "-out", messages)
            cpu_us = (time.process_time() - cpu_before) / messages * 1e6
            rates[name].append(rate)
            cpu[name].append(cpu_us)
            print(
                f"  {name:<11} {rate:>10,.0f} msg/s  {cpu_us:5.1f} us CPU a message",
                file=sys.stderr,
                flush=True,
            )
    client.close()
    return {"rates": rates, "cpu_us_per_message": cpu}


def _summarize(phase: dict[str, Any], baseline: str, candidate: str) -> dict[str, Any]:
    rates, cpu = phase["rates"], phase["cpu_us_per_message"]
    base = statistics.median(rates[baseline])
    cand = statistics.median(rates[candidate])
    base_cpu = statistics.median(cpu[baseline])
    cand_cpu = statistics.median(cpu[candidate])
    return {
        f"{baseline}_rates": rates[baseline],
        f"{candidate}_rates": rates[candidate],
        f"{baseline}_median": base,
        f"{candidate}_median": cand,
        "ratio": cand / base,
        f"{baseline}_cpu_us_per_message": cpu[baseline],
        f"{candidate}_cpu_us_per_message": cpu[candidate],
        f"{baseline}_cpu_median": base_cpu,
        f"{candidate}_cpu_median": cand_cpu,
        "cpu_ratio": base_cpu / cand_cpu,
    }


def compare(
    doc: str,
    result_name: str,
    baseline: tuple[str, Side],
    candidate: tuple[str, Side],
    brokers: str = "lite",
) -> None:
    """The benchmark's ``main``: parse the flags, run both sides in every mode on every broker
    chosen, write and print the results."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    add_broker_options(parser, default=brokers)
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / f"{result_name}.json"))
    parser.add_argument("--phase-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sides = dict([baseline, candidate])

    if args.phase_only:
        # the last line: the client's C++ logger also writes to stdout
        print("\n" + json.dumps(_phase(args.broker_url, args.messages, args.repeat, sides)))
        return

    results: dict[str, Any] = {
        "messages": args.messages,
        "payload_bytes": len(PAYLOAD),
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "brokers": {},
    }
    modes: dict[str, list[str]] = {"unpinned": []}
    if shutil.which("taskset"):
        modes["pinned_cpu1"] = ["taskset", "-c", "1"]
    for name in chosen(args):
        with running(name, args) as broker:
            print(f"{name} ({broker.description}):", file=sys.stderr, flush=True)
            measured: dict[str, Any] = {"description": broker.description}
            for mode, prefix in modes.items():
                print(f" {mode}:", file=sys.stderr, flush=True)
                command = [
                    *prefix,
                    sys.executable,
                    os.path.abspath(sys.argv[0]),
                    "--phase-only",
                    "--broker-url",
                    broker.service_url,
                    "--messages",
                    str(args.messages),
                    "--repeat",
                    str(args.repeat),
                ]
                out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
                phase = json.loads(out.strip().splitlines()[-1])  # last line: other lines are noise
                measured[mode] = _summarize(phase, baseline[0], candidate[0])
            results["brokers"][name] = measured
    for mode in modes:
        for side in (baseline[0], candidate[0]):
            ratio = side_by_side(results["brokers"], (mode, f"{side}_median"))
            if ratio is not None:
                results.setdefault("apache_over_lite", {}).setdefault(mode, {})[side] = ratio
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2))
    base, cand = f"{baseline[0]} msg/s", f"{candidate[0]} msg/s"
    base_cpu, cand_cpu = f"{baseline[0]} us CPU", f"{candidate[0]} us CPU"
    print(
        f"\n{'broker':<8} {'mode':<12} {base:>18} {cand:>18} {'ratio':>7} "
        f"{base_cpu:>16} {cand_cpu:>16} {'ratio':>7}"
    )
    for name, measured in results["brokers"].items():
        for mode in modes:
            r = measured[mode]
            print(
                f"{name:<8} {mode:<12} {r[f'{baseline[0]}_median']:>18,.0f} "
                f"{r[f'{candidate[0]}_median']:>18,.0f} {r['ratio']:>7.2f} "
                f"{r[f'{baseline[0]}_cpu_median']:>16.1f} "
                f"{r[f'{candidate[0]}_cpu_median']:>16.1f} {r['cpu_ratio']:>7.2f}"
            )
    print(f"\nwritten to {output}")
