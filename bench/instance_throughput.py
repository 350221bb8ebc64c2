"""Instance throughput: the exclamation function through a Magnetar instance vs a plain
pulsar-client loop, end to end, in the same run.

Both read the same number of 100-byte messages from a topic of their own, produce the
results (async, batched) and acknowledge each input after its output is persisted (the
plain loop in each send's callback, as an ATLEAST_ONCE user would write it). Each side runs
``--repeat`` times, alternating, unpinned and pinned to one core (``taskset -c 1``); the JSON
holds every rate, the medians and the ratio of medians.

    python bench/instance_throughput.py [--messages 100000] [--repeat 3] [--broker-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pulsar

from magnetar.broker import EmbeddedBroker
from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = b"x" * 100


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


def plain_loop(client: pulsar.Client, source: str, sink: str, count: int) -> float:
    consumer = client.subscribe(
        source,
        "plain",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = client.create_producer(
        sink,
        batching_enabled=True,
        batching_max_publish_delay_ms=10,
        block_if_queue_full=True,
        max_pending_messages=40_000,
    )
    started = time.perf_counter()
    for _ in range(count):
        message = consumer.receive()

        def acknowledge(result: Any, message_id: Any, message: Any = message) -> None:
            consumer.acknowledge(message)

        producer.send_async(message.data() + b"!", acknowledge)
    producer.flush()
    elapsed = time.perf_counter() - started
    consumer.close()
    producer.close()
    return count / elapsed


def magnetar_instance(client: pulsar.Client, source: str, sink: str, count: int) -> float:
    config = FunctionConfig(
        name=f"bench-{uuid.uuid4().hex[:6]}",
        py=str(ROOT / "examples" / "exclamation.py"),
        class_name="exclamation.ExclamationFunction",
        inputs=[source],
        output=sink,
        subscription_position="Earliest",
    )
    instance = FunctionInstance(config, client, InstanceOptions())

    def stop_when_done() -> None:
        while instance.metrics.processed < count:
            time.sleep(0.005)
        instance.stop(drain=True)

    watcher = threading.Thread(target=stop_when_done, daemon=True)
    started = time.perf_counter()  # includes subscribing: a few ms against the plain loop
    watcher.start()
    instance.run()
    elapsed = time.perf_counter() - started
    return count / elapsed


def phase(broker_url: str, messages: int, repeat: int) -> dict[str, list[float]]:
    """Run both sides ``repeat`` times, alternating, in this process."""
    client = pulsar.Client(broker_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    rates: dict[str, list[float]] = {"plain": [], "magnetar": []}
    for round_ in range(repeat):
        order = ["plain", "magnetar"] if round_ % 2 == 0 else ["magnetar", "plain"]
        for side in order:
            source = f"bench-in-{uuid.uuid4().hex[:8]}"
            fill(client, source, messages)
            run = plain_loop if side == "plain" else magnetar_instance
            rate = run(client, source, source + "-out", messages)
            rates[side].append(rate)
            print(f"  {side:<9} {rate:>10,.0f} msg/s", file=sys.stderr, flush=True)
    client.close()
    return rates


def summarize(rates: dict[str, list[float]]) -> dict[str, Any]:
    plain = statistics.median(rates["plain"])
    magnetar = statistics.median(rates["magnetar"])
    return {
        "plain_rates": rates["plain"],
        "magnetar_rates": rates["magnetar"],
        "plain_median": plain,
        "magnetar_median": magnetar,
        "ratio": magnetar / plain,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--broker-url")
    parser.add_argument(
        "--output", default=str(ROOT / "bench" / "results" / "instance_throughput.json")
    )
    parser.add_argument("--phase-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.phase_only:
        json.dump(phase(args.broker_url, args.messages, args.repeat), sys.stdout)
        return

    data_dir = tempfile.mkdtemp(prefix="magnetar-bench-")
    broker = None
    try:
        url = args.broker_url
        if url is None:
            broker = EmbeddedBroker(data_dir).start()
            url = broker.service_url
        results: dict[str, Any] = {
            "messages": args.messages,
            "payload_bytes": len(PAYLOAD),
            "repeat": args.repeat,
            "cpus": os.cpu_count(),
        }
        modes = {"unpinned": []}
        if shutil.which("taskset"):
            modes["pinned_cpu1"] = ["taskset", "-c", "1"]
        for mode, prefix in modes.items():
            print(f"{mode}:", file=sys.stderr, flush=True)
            command = [
                *prefix,
                sys.executable,
                __file__,
                "--phase-only",
                "--broker-url",
                url,
                "--messages",
                str(args.messages),
                "--repeat",
                str(args.repeat),
            ]
            out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
            results[mode] = summarize(json.loads(out))
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2))
        print(f"\n{'mode':<12} {'plain msg/s':>12} {'magnetar msg/s':>15} {'ratio':>7}")
        for mode in modes:
            r = results[mode]
            print(
                f"{mode:<12} {r['plain_median']:>12,.0f} {r['magnetar_median']:>15,.0f} "
                f"{r['ratio']:>7.2f}"
            )
        print(f"\nwritten to {output}")
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
