"""Publish-to-output latency at a steady rate: Magnetar's instances vs a hand-written loop.

Each input carries the wall-clock time of its send; the output is the exclamation of it, and
its latency is the time from that send until a consumer of the output topic has it. Inputs
are sent unbatched at ``--rates`` messages per second (paced every millisecond) for
``--seconds`` each, after ``--warm-up`` seconds that are not counted. Subjects, each on a
topic pair of its own, in one run:

* ``loop``: a hand-written pulsar-client loop in a process of its own (receive, send async
  with batching and a 1 ms publish delay, acknowledge in the send's callback): the baseline;
* ``localrun-python`` / ``localrun-js``: ``magnetar functions localrun`` of
  examples/exclamation.py / examples/exclamation.js;
* ``cluster-python`` / ``cluster-js``: the same functions on three ``magnetar worker start``
  processes, parallelism 3.

Every subject runs ``--repeat`` times, alternating; the JSON holds p50/p99/p999 of every run,
their medians, and each subject's ratio of medians to the loop's, on each broker
(``--broker lite|apache|both``).

    python bench/latency.py [--rates 100,1000,10000] [--seconds 8] [--repeat 3]
                            [--subjects loop,localrun-python,...] [--broker lite]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pulsar
from _brokers import Broker, add_broker_options, chosen, running
from _cluster import ROOT, Cluster, progress, wait_until

SUBJECTS = ("loop", "localrun-python", "localrun-js", "cluster-python", "cluster-js")
CODE = {
    "python": (ROOT / "examples" / "exclamation.py", "exclamation.ExclamationFunction"),
    "js": (ROOT / "examples" / "exclamation.js", None),
}
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)

Subject = Callable[[str, str], Iterator[None]]
"""Runs a subject from one topic into another while the context is open."""


# --- the subjects ----------------------------------------------------------------------------


def loop_main(service_url: str, source: str, sink: str) -> None:
    """The hand-written loop (run as ``latency.py --loop URL SOURCE SINK``)."""
    client = pulsar.Client(service_url, logger=QUIET)
    consumer = client.subscribe(source, "loop", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(
        sink, batching_enabled=True, batching_max_publish_delay_ms=1, block_if_queue_full=True
    )
    print("ready", flush=True)
    while True:
        message = consumer.receive()

        def acknowledge(result: Any, message_id: Any, message: Any = message) -> None:
            consumer.acknowledge(message)

        producer.send_async(message.data() + b"!", acknowledge)


@contextmanager
def child(command: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def subjects(broker: Broker, work: Path, stack: ExitStack) -> dict[str, Subject]:
    """The subjects by name; the cluster starts on first use and stops with ``stack``."""
    cluster: list[Cluster] = []

    @contextmanager
    def loop(source: str, sink: str) -> Iterator[None]:
        command = [sys.executable, __file__, "--loop", broker.service_url, source, sink]
        with child(command, work / "loop.log"):
            yield

    def localrun(language: str) -> Subject:
        @contextmanager
        def run(source: str, sink: str) -> Iterator[None]:
            code, class_name = CODE[language]
            command = [
                sys.executable, "-m", "magnetar.cli", "functions", "localrun",
                "--broker-service-url", broker.service_url,
                "--py" if language == "python" else "--js", str(code),
                "--inputs", source, "--output", sink,
                "--name", f"latency-{uuid.uuid4().hex[:6]}",
            ]  # fmt: skip
            if class_name:
                command += ["--classname", class_name]
            with child(command, work / f"localrun-{language}.log"):
                yield

        return run

    def on_cluster(language: str) -> Subject:
        @contextmanager
        def run(source: str, sink: str) -> Iterator[None]:
            if not cluster:
                env = {"MAGNETAR_PULSAR_ADMIN_URL": broker.admin_url} if broker.admin_url else {}
                (work / "cluster").mkdir()
                started = Cluster(broker.service_url, work / "cluster", "public/latency", env)
                stack.callback(started.stop_all)
                workers = [started.start_worker(f"w{i}") for i in range(3)]
                for worker in workers:
                    started.wait_ready(worker)
                started.wait_members(workers[0], 3)
                cluster.append(started)
            found = cluster[0]
            via = next(iter(found.workers.values()))
            code, class_name = CODE[language]
            name = f"latency-{language}-{uuid.uuid4().hex[:6]}"
            config: dict[str, Any] = {"inputs": [source], "output": sink, "parallelism": 3}
            if class_name:
                config["className"] = class_name
            found.register(via, name, code, **config)
            wait_until(lambda: found.num_running(via, name) == 3, 60, f"{name} running")
            try:
                yield
            finally:
                found.delete(via, name)

        return run

    return {
        "loop": loop,
        "localrun-python": localrun("python"),
        "localrun-js": localrun("js"),
        "cluster-python": on_cluster("python"),
        "cluster-js": on_cluster("js"),
    }


# --- one measurement ---------------------------------------------------------------------------


def wait_flowing(client: pulsar.Client, source: str, consumer: Any) -> None:
    """Send probes until one comes out: the subject is subscribed and running."""
    producer = client.create_producer(source, batching_enabled=False)
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            producer.send(b"probe")
            try:
                while True:
                    message = consumer.receive(500)
                    consumer.acknowledge(message)
                    if message.data() == b"probe!":
                        return
            except pulsar.Timeout:
                continue
        raise RuntimeError(f"no output for the probes sent to {source} within 90 s")
    finally:
        producer.close()


def measure(client: pulsar.Client, source: str, sink: str, rate: int, args: Any) -> list[float]:
    """Latencies (ms) of the inputs sent after the warm-up, at ``rate`` messages a second."""
    consumer = client.subscribe(sink, "latency", receiver_queue_size=10_000)
    try:
        wait_flowing(client, source, consumer)
        producer = client.create_producer(
            source, batching_enabled=False, block_if_queue_full=True, max_pending_messages=50_000
        )
        total = int(rate * (args.warm_up + args.seconds))
        counted_from = int(rate * args.warm_up)

        def send_paced() -> None:
            started = time.perf_counter()
            for i in range(total):
                delay = started + i / rate - time.perf_counter()
                if delay > 0.001:
                    time.sleep(delay)
                producer.send_async(f"{i}:{time.time_ns()}".encode(), None)
            producer.flush()

        sender = threading.Thread(target=send_paced, daemon=True)
        sender.start()
        latencies: list[float] = []
        seen: set[int] = set()
        deadline = time.monotonic() + args.warm_up + args.seconds + 30
        while len(seen) < total and time.monotonic() < deadline:
            try:
                message = consumer.receive(1000)
            except pulsar.Timeout:
                continue
            now = time.time_ns()
            consumer.acknowledge(message)
            data = message.data()
            if data == b"probe!":
                continue
            index, sent = data.rstrip(b"!").split(b":")
            if int(index) in seen:
                continue
            seen.add(int(index))
            if int(index) >= counted_from:
                latencies.append((now - int(sent)) / 1e6)
        sender.join(30)
        producer.close()
        if len(seen) < total:
            raise RuntimeError(f"{total - len(seen)} of {total} outputs missing from {sink}")
        return latencies
    finally:
        consumer.close()


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50": at(0.5), "p99": at(0.99), "p999": at(0.999), "count": len(ordered)}


# --- the run -----------------------------------------------------------------------------------


def run_broker(broker: Broker, args: Any) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    client = pulsar.Client(broker.service_url, logger=QUIET)
    with tempfile.TemporaryDirectory(prefix="magnetar-latency-") as tmp, ExitStack() as stack:
        found = subjects(broker, Path(tmp), stack)
        for round_no in range(args.repeat):
            for name in args.subjects:
                for rate in args.rates:
                    source = f"lat-{uuid.uuid4().hex[:8]}"
                    sink = f"{source}-out"
                    try:
                        with found[name](source, sink):
                            figures = percentiles(measure(client, source, sink, rate, args))
                    except RuntimeError as error:
                        logs = "".join(
                            f"\n{p.name}:\n{p.read_text()[-2000:]}" for p in Path(tmp).glob("*.log")
                        )
                        raise RuntimeError(f"{name} at {rate}/s: {error}{logs}") from None
                    runs.setdefault(name, {}).setdefault(str(rate), []).append(figures)
                    progress(
                        f"  {broker.name} round {round_no + 1}/{args.repeat} {name:16} "
                        f"{rate:>6}/s  p50 {figures['p50']:7.2f} ms  p99 {figures['p99']:7.2f}"
                        f" ms  p999 {figures['p999']:7.2f} ms"
                    )
    client.close()
    return {"broker": broker.description, "runs": runs, "medians": summarize(runs)}


def summarize(runs: dict[str, dict[str, list[dict[str, float]]]]) -> dict[str, Any]:
    medians: dict[str, Any] = {}
    for name, by_rate in runs.items():
        for rate, figures in by_rate.items():
            row = {
                q: round(statistics.median(f[q] for f in figures), 3)
                for q in ("p50", "p99", "p999")
            }
            loop = runs.get("loop", {}).get(rate)
            if loop and name != "loop":
                for q in ("p50", "p99"):
                    baseline = statistics.median(f[q] for f in loop)
                    row[f"{q}_vs_loop"] = round(row[q] / baseline, 2)
            medians.setdefault(name, {})[rate] = row
    return medians


def table(medians: dict[str, Any]) -> str:
    lines = [f"{'subject':17} {'rate':>7} {'p50 ms':>8} {'p99 ms':>8} {'p999 ms':>8}  vs loop"]
    for name, by_rate in medians.items():
        for rate, row in by_rate.items():
            versus = (
                f"p50 {row['p50_vs_loop']}x  p99 {row['p99_vs_loop']}x"
                if "p50_vs_loop" in row
                else ""
            )
            lines.append(
                f"{name:17} {rate:>7} {row['p50']:8.2f} {row['p99']:8.2f} {row['p999']:8.2f}"
                f"  {versus}"
            )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--loop":
        loop_main(*sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="100,1000,10000")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warm-up", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--subjects", default=",".join(SUBJECTS))
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "latency.json")
    add_broker_options(parser, default="lite")
    args = parser.parse_args()
    args.rates = [int(r) for r in args.rates.split(",")]
    args.subjects = [s for s in args.subjects.split(",") if s]
    unknown = set(args.subjects) - set(SUBJECTS)
    if unknown:
        parser.error(f"unknown subjects {sorted(unknown)}; choose from {', '.join(SUBJECTS)}")
    results: dict[str, Any] = {
        "benchmark": "latency",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": {k: v for k, v in vars(args).items() if k != "output"},
    }
    for name in chosen(args):
        with running(name, args) as broker:
            results[name] = run_broker(broker, args)
        print(f"\n{broker.description}\n{table(results[name]['medians'])}\n")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2, default=str))
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
