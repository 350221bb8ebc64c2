"""Publish-to-output latency at a steady rate: Magnetar's instances vs a hand-written loop.

Each input carries the wall-clock time of its send; the output is the exclamation of it, and
its latency is the time from that send until a consumer of the output topic has it. Inputs
are sent unbatched at ``--rates`` messages per second (in bursts of what is due, about every
half millisecond, each stamped at its own send) for ``--seconds`` each, after ``--warm-up``
seconds that are not counted; the sender and the receiver are processes of their own
(bench/_paced_stream.py). A subject that lags or loses outputs is recorded, not failed:
``missing`` outputs and ``drain_ms``, the time from the last send to the last output.
Subjects, each on a topic pair of its own, in one run:

* ``loop``: a hand-written pulsar-client loop in a process of its own (receive, send async
  with batching and a 1 ms publish delay, acknowledge in the send's callback): the baseline;
* ``loops-3``: three such loops sharing their subscription, the hand-written counterpart of a
  cluster's three instances: on pulsar-lite they acknowledge at once and prefetch 30 messages,
  as instances sharing a subscription there do (with pulsar-client's defaults they fall
  seconds behind at 10,000 msg/s). The cluster subjects' ratios to it are given too;
* ``localrun-python`` / ``localrun-js``: ``magnetar functions localrun`` of
  examples/exclamation.py / examples/exclamation.js;
* ``cluster-python`` / ``cluster-js``: the same functions on three ``magnetar worker start``
  processes, parallelism 3;
* ``cluster-python-1`` / ``cluster-js-1``: the same, at Apache Pulsar's default parallelism
  of 1: what a function created on the cluster without ``--parallelism`` is, one consumer as
  the loop is.

Every subject runs ``--repeat`` times, alternating; the JSON holds p50/p99/p999 of every run
(with the sender's kept rate and the machine's load before and after), their medians, and
each subject's ratio of medians to the loop's, on each broker (``--broker lite|apache|both``).

    python bench/latency.py [--rates 100,1000,10000] [--seconds 8] [--repeat 3]
                            [--subjects loop,localrun-python,...] [--broker lite]
                            [--max-load 4] [--no-cpu-limits] [--no-isolation]
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
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pulsar
from _brokers import Broker, add_broker_options, chosen, running
from _cluster import ROOT, Cluster, progress, wait_until

from magnetar.client import create_client, shared_acks_cost_gaps, subscribe
from magnetar.instance.acks_at_once import acking_at_once
from magnetar.instance.subscription import SHARED_ON_GAPPED_CURSOR

SUBJECTS = (
    "loop",
    "loops-3",
    "localrun-python",
    "localrun-js",
    "cluster-python",
    "cluster-js",
    "cluster-python-1",
    "cluster-js-1",
)
SHARING = {"loops-3": 3, "cluster-python": 3, "cluster-js": 3}
"""The subjects whose consumers share their subscription, and how many they are (the loops
and instances each runs); a cluster subject's ratio to ``loops-3`` is given only where it
runs as many."""
CODE = {
    "python": (ROOT / "examples" / "exclamation.py", "exclamation.ExclamationFunction"),
    "js": (ROOT / "examples" / "exclamation.js", None),
}

Subject = Callable[[str, str], AbstractContextManager[None]]
"""Runs a subject from one topic into another while the context is open."""


# --- the subjects ----------------------------------------------------------------------------


def loop_main(service_url: str, source: str, sink: str, sharing: str) -> None:
    """The hand-written loop (run as ``latency.py --loop URL SOURCE SINK SHARING``).

    Its client is made as Magnetar's are: pulsar-lite 0.2 does not answer a subscription
    whose consumer id another connection uses, every client numbers its consumers from 0, and
    so of three plain clients' loops two would wait out a subscribe timeout (30 s) before
    sharing the work. ``SHARING`` ``shared``: the loop shares its subscription with others,
    and on pulsar-lite consumes as instances that share one do (see ``subscription``): with
    pulsar-client's defaults three loops fell 7 to 19 s behind at 10,000 msg/s."""
    client = create_client(service_url)
    settings: dict[str, Any] = {}
    if sharing == "shared" and shared_acks_cost_gaps(service_url):
        client = acking_at_once(client)
        settings["receiver_queue_size"] = SHARED_ON_GAPPED_CURSOR
    consumer = subscribe(
        client, source, "loop", consumer_type=pulsar.ConsumerType.Shared, **settings
    )
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


def subjects(
    broker: Broker, work: Path, stack: ExitStack, worker_env: dict[str, str] | None = None
) -> dict[str, Subject]:
    """The subjects by name; the cluster starts on first use (its workers with
    ``worker_env`` added) and stops with ``stack``."""
    cluster: list[Cluster] = []

    def loops(count: int) -> Subject:
        @contextmanager
        def run(source: str, sink: str) -> Iterator[None]:
            command = [sys.executable, __file__, "--loop", broker.service_url, source, sink]
            command.append("shared" if count > 1 else "alone")
            with ExitStack() as running:
                for _ in range(count):
                    running.enter_context(child(command, work / "loop.log"))
                yield

        return run

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

    def on_cluster(language: str, parallelism: int) -> Subject:
        @contextmanager
        def run(source: str, sink: str) -> Iterator[None]:
            if not cluster:
                env = {"MAGNETAR_PULSAR_ADMIN_URL": broker.admin_url} if broker.admin_url else {}
                env.update(worker_env or {})
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
            config: dict[str, Any] = {
                "inputs": [source],
                "output": sink,
                "parallelism": parallelism,
            }
            if class_name:
                config["className"] = class_name
            found.register(via, name, code, **config)
            wait_until(lambda: found.num_running(via, name) == parallelism, 60, f"{name} running")
            try:
                yield
            finally:
                found.delete(via, name)

        return run

    return {
        "loop": loops(1),
        "loops-3": loops(SHARING["loops-3"]),
        "localrun-python": localrun("python"),
        "localrun-js": localrun("js"),
        "cluster-python": on_cluster("python", SHARING["cluster-python"]),
        "cluster-js": on_cluster("js", SHARING["cluster-js"]),
        "cluster-python-1": on_cluster("python", 1),
        "cluster-js-1": on_cluster("js", 1),
    }


# --- one measurement ---------------------------------------------------------------------------

STREAM = Path(__file__).resolve().parent / "_paced_stream.py"


def measure(broker: Broker, source: str, sink: str, rate: int, args: Any) -> dict[str, Any]:
    """Figures of the inputs sent after the warm-up, at ``rate`` messages a second: the
    sender and the receiver are processes of their own (see _paced_stream.py); a subject that
    lags or loses outputs is recorded so (``drain_ms``, ``missing``)."""
    total = int(rate * (args.warm_up + args.seconds))
    counted_from = int(rate * args.warm_up)
    stream = [sys.executable, str(STREAM)]
    url = broker.service_url
    receiver = subprocess.Popen(
        [*stream, "receive", url, source, sink, str(total), str(counted_from),
         str(args.warm_up + args.seconds + 3)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert receiver.stdout is not None
        if receiver.stdout.readline().strip() != "flowing":
            receiver.wait(10)
            raise RuntimeError(f"the subject never answered a probe on {source}")
        sender = subprocess.run(
            [*stream, "send", url, source, str(rate), str(total)],
            stdout=subprocess.PIPE, text=True, check=True,
            timeout=args.warm_up + args.seconds + 120,
        )  # fmt: skip
        figures: dict[str, Any] = json.loads(receiver.stdout.read())
        receiver.wait(10)
        return {**figures, "sender": json.loads(sender.stdout)}
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


def load() -> float:
    """The machine's one-minute load average (others' processes disturb the figures)."""
    return round(os.getloadavg()[0], 2)


def cpu_times() -> tuple[int, int]:
    """The machine's (idle, total) CPU time so far, in ticks."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def wait_quiet(max_load: float | None, patience_s: float = 60) -> None:
    """Wait (a bounded time) until the one-minute load is at most ``max_load``."""
    deadline = time.monotonic() + patience_s
    while max_load is not None and load() > max_load and time.monotonic() < deadline:
        time.sleep(2)


# --- the run -----------------------------------------------------------------------------------


def run_broker(broker: Broker, args: Any) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="magnetar-latency-") as tmp, ExitStack() as stack:
        off = {"MAGNETAR_INSTANCE_CPU_LIMITS": "false"} if args.no_cpu_limits else {}
        if args.no_isolation:
            off["MAGNETAR_INSTANCE_ISOLATION"] = "false"
        found = subjects(broker, Path(tmp), stack, off)
        for round_no in range(args.repeat):
            for name in args.subjects:
                for rate in args.rates:
                    source = f"lat-{uuid.uuid4().hex[:8]}"
                    sink = f"{source}-out"
                    wait_quiet(args.max_load)
                    load_before, idle_before = load(), cpu_times()
                    try:
                        with found[name](source, sink):
                            figures = measure(broker, source, sink, rate, args)
                    except (RuntimeError, subprocess.SubprocessError) as error:
                        logs = "".join(
                            f"\n{p.name}:\n{p.read_text()[-2000:]}" for p in Path(tmp).glob("*.log")
                        )
                        raise RuntimeError(f"{name} at {rate}/s: {error}{logs}") from None
                    idle_after = cpu_times()
                    figures["load"] = [load_before, load()]
                    # the machine's idle share over the subject's start and measurement
                    figures["idle"] = round(
                        (idle_after[0] - idle_before[0]) / (idle_after[1] - idle_before[1]), 2
                    )
                    runs.setdefault(name, {}).setdefault(str(rate), []).append(figures)
                    progress(
                        f"  {broker.name} round {round_no + 1}/{args.repeat} {name:16} "
                        f"{rate:>6}/s  {line(figures)}  sender {figures['sender']['rate_kept']}/s"
                        f" slip p99 {figures['sender']['slip_p99_ms']} ms"
                        f"  load {figures['load'][0]}-{figures['load'][1]} idle {figures['idle']}"
                    )
    return {"broker": broker.description, "runs": runs, "medians": summarize(runs)}


def line(figures: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "      -" if value is None else f"{value:7.2f}"

    return (
        f"p50 {ms(figures['p50'])} ms  p99 {ms(figures['p99'])} ms  p999 {ms(figures['p999'])}"
        f" ms  missing {figures['missing']}  drain {ms(figures['drain_ms'])} ms"
    )


def median(figures: list[dict[str, Any]], key: str) -> float | None:
    values = [f[key] for f in figures if f[key] is not None]
    return round(statistics.median(values), 3) if values else None


def summarize(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    medians: dict[str, Any] = {}
    for name, by_rate in runs.items():
        for rate, figures in by_rate.items():
            row = {q: median(figures, q) for q in ("p50", "p99", "p999", "missing", "drain_ms")}
            for baseline_name, suffix in (("loop", "loop"), ("loops-3", "loops3")):
                baseline_runs = runs.get(baseline_name, {}).get(rate)
                if (
                    not baseline_runs
                    or name.startswith("loop")
                    or (suffix == "loops3" and SHARING.get(name) != SHARING["loops-3"])
                ):
                    continue
                for q in ("p50", "p99"):
                    baseline, value = median(baseline_runs, q), row[q]
                    if baseline and value is not None:
                        row[f"{q}_vs_{suffix}"] = round(value / baseline, 2)
            medians.setdefault(name, {})[rate] = row
    return medians


def table(medians: dict[str, Any]) -> str:
    lines = [
        f"{'subject':17} {'rate':>7} {'p50 ms':>8} {'p99 ms':>8} {'p999 ms':>8} {'missing':>8}"
        f" {'drain ms':>9}  vs loop"
    ]

    def ms(value: float | None, width: int) -> str:
        return f"{'-':>{width}}" if value is None else f"{value:{width}.2f}"

    for name, by_rate in medians.items():
        for rate, row in by_rate.items():
            versus = (
                f"p50 {row.get('p50_vs_loop', '-')}x  p99 {row.get('p99_vs_loop', '-')}x"
                if not name.startswith("loop")
                else ""
            )
            if "p99_vs_loops3" in row:
                versus += f"  (loops-3: p50 {row['p50_vs_loops3']}x  p99 {row['p99_vs_loops3']}x)"
            lines.append(
                f"{name:17} {rate:>7} {ms(row['p50'], 8)} {ms(row['p99'], 8)}"
                f" {ms(row['p999'], 8)} {row['missing']:8.0f} {ms(row['drain_ms'], 9)}  {versus}"
            )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--loop":
        loop_main(*sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="100,1000,10000")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warm-up", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--subjects", default=",".join(SUBJECTS))
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "latency.json")
    parser.add_argument(
        "--max-load",
        type=float,
        help="before each measurement, wait (up to a minute) until the machine's one-minute"
        " load is at most this (the figures record it either way)",
    )
    parser.add_argument(
        "--no-cpu-limits",
        action="store_true",
        help="the cluster's workers with instance_cpu_limits off (resources.cpu not enforced)",
    )
    parser.add_argument(
        "--no-isolation",
        action="store_true",
        help="the cluster's workers with instance_isolation off (a root worker's instances "
        "then run as its user, without their syscall filter, file scope and network rules)",
    )
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
