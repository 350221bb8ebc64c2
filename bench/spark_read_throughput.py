"""Spark reads: throughput against one plain pulsar-client reader, and the first-read cost.

Throughput: Spark reads of the ``pulsar`` source against a single plain pulsar-client reader
loop, in the same run, over the same topics; with the CPU each side's processes used per
message (the broker's left out), steadier than rates on a shared machine. The workloads
(``--workloads``): a batch ``count()``, a batch ``groupBy`` with aggregates over ``value``, and
a streaming query with Trigger.AvailableNow draining the topics into a noop sink; each on every
read path of ``--paths`` (``magnetar.readPath``: the native reader, the Python client). The
messages (100 bytes each) are spread evenly over 1 and 4 topics. The plain loop reads the
topics one after the other with one reader each, skipping the duplicates pulsar-lite's readers
deliver (the rule the connector uses too), and touches every payload. With java and the Java
client's jars (Maven fetched them for the suite's pulsar-admin: make install), the Java client
reading the same topics in one JVM loop (bench/jvm/JvmReaderLoop.java; the time of its warm
second pass, its CPU over start-up and both passes) is a baseline too (``--no-jvm`` leaves it
out). Spark runs on ``--master`` (``local[*]`` by default) after ``--warm-up-reads`` reads of
as many topics, so the figures exclude starting the session and its Python workers. The JVM's
JIT compiler keeps working for some 20-30 reads more (0.3-1 CPU-seconds a read over the first
ten on a 2-core machine): its share of the Spark side's CPU is shown apart ("JIT"). Each side
runs ``--repeat`` times, in an order that rotates from round to round; the JSON holds every
time, the medians and the load average before each.

First read: a fresh session (its own process) times its first and second ``load()`` +
``count()`` of a one-message topic, and the same for a Python data source that yields one
row and does nothing else (the baseline: what any Python data source pays for Spark's Python
workers to start). The difference of the first reads is what the ``pulsar`` data source
itself adds. ``--first-reads`` sessions of each, alternating.

    python bench/spark_read_throughput.py [--messages 1000000] [--topics 1,4]
        [--workloads count,groupBy,stream] [--paths python,native] [--repeat 1]
        [--jvm] [--broker lite|apache] [--broker-url URL] [--first-reads 3]
        [--warm-up-reads 1] [--master local[*]]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pulsar
from _throughput import PAYLOAD, ROOT, fill
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sql
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from magnetar.broker import EmbeddedBroker
from magnetar.spark_connector import spark_session
from magnetar.testing import ApachePulsarStandalone

_SESSION_CONF = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _processes() -> dict[int, tuple[int, float]]:
    """Parent and CPU seconds of every process (Linux only: none elsewhere)."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS)
    return stats


def _descendants(stats: dict[int, tuple[int, float]]) -> set[int]:
    """This process and its descendants (the JVM and Spark's Python workers)."""
    mine = {os.getpid()}
    grew = True
    while grew:
        more = {pid for pid, (parent, _) in stats.items() if parent in mine} - mine
        mine |= more
        grew = bool(more)
    return mine


def _tree_cpu_s(exclude: int | None) -> float:
    """CPU seconds used so far by this process and its descendants, the broker left out: on
    a machine shared with other work, CPU per message is steadier than wall time."""
    stats = _processes()
    mine = _descendants(stats) - {exclude or -1}
    return sum(stats[pid][1] for pid in mine if pid in stats)


def _jit_cpu_s() -> float:
    """CPU seconds the JIT compiler threads of this process's JVMs used so far: a JVM keeps
    compiling Spark's code for dozens of queries after it starts, a cost each of the first
    reads carries (part of the Spark side's CPU per message)."""
    total = 0.0
    for pid in _descendants(_processes()):
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                stat = Path(f"/proc/{pid}/task/{thread}/stat").read_text()
            except OSError:
                continue
            name, fields = stat.split("(", 1)[1].rsplit(")", 1)
            if name.startswith(("C1 CompilerThre", "C2 CompilerThre")):
                values = fields.split()
                total += (int(values[11]) + int(values[12])) / _TICKS
    return total


def plain_loop(client: pulsar.Client, topics: list[str], per_topic: int) -> float:
    """Seconds for one reader per topic, in turn, to read every message once."""
    started = time.perf_counter()
    total_bytes = 0
    for topic in topics:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        last = (-1, -1, -1)
        read = 0
        while read < per_topic:
            message = reader.read_next(30_000)
            message_id = message.message_id()
            position = (message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())
            if position <= last:
                continue  # a redelivery
            last = position
            total_bytes += len(message.data())
            read += 1
        reader.close()
    elapsed = time.perf_counter() - started
    assert total_bytes == len(PAYLOAD) * per_topic * len(topics)
    return elapsed


def _frame(spark: SparkSession, url: str, topics: list[str], path: str) -> DataFrame:
    return (
        spark.read.format("pulsar")
        .option("service.url", url)
        .option("topics", ",".join(topics))
        .option("magnetar.readPath", path)
        .load()
    )


def spark_count(
    spark: SparkSession, url: str, topics: list[str], expected: int, path: str = "auto"
) -> float:
    """Seconds for a batch read of ``topics`` to count every message."""
    started = time.perf_counter()
    count = _frame(spark, url, topics, path).count()
    elapsed = time.perf_counter() - started
    assert count == expected, f"Spark counted {count}, expected {expected}"
    return elapsed


def spark_group_by(
    spark: SparkSession, url: str, topics: list[str], expected: int, path: str
) -> float:
    """Seconds for a batch read grouped by the value's length, with aggregates over the
    values (every payload is read into Spark, not only counted)."""
    started = time.perf_counter()
    rows = (
        _frame(spark, url, topics, path)
        .groupBy(sql.length("value").alias("size"))
        .agg(sql.count("*").alias("n"), sql.max("value"), sql.min("__publishTime"))
        .collect()
    )
    elapsed = time.perf_counter() - started
    assert sum(row["n"] for row in rows) == expected, rows
    return elapsed


def spark_stream(
    spark: SparkSession, url: str, topics: list[str], expected: int, path: str
) -> float:
    """Seconds for a streaming query with Trigger.AvailableNow to drain ``topics`` into a
    noop sink (checkpointing included, as a streaming query pays it)."""
    checkpoint = tempfile.mkdtemp(prefix="magnetar-bench-stream-")
    started = time.perf_counter()
    query = (
        spark.readStream.format("pulsar")
        .option("service.url", url)
        .option("topics", ",".join(topics))
        .option("startingOffsets", "earliest")
        .option("magnetar.readPath", path)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(600)
        elapsed = time.perf_counter() - started
        read = sum(progress["numInputRows"] for progress in query.recentProgress)
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    assert read == expected, f"the stream read {read}, expected {expected}"
    return elapsed


WORKLOADS = {"count": spark_count, "groupBy": spark_group_by, "stream": spark_stream}

_JVM_LOOP = ROOT / "bench" / "jvm" / "JvmReaderLoop.java"
_JVM_CLASSPATH = ROOT / "apache-pulsar" / "pulsar-admin" / "classpath.txt"
"""The Java client's jars: Maven fetched them for the suite's pulsar-admin (make install)."""


def jvm_available() -> bool:
    return shutil.which("java") is not None and _JVM_CLASSPATH.exists()


def jvm_loop(url: str, topics: list[str], per_topic: int) -> tuple[float, float]:
    """The Java client reading ``topics`` in one JVM loop, twice: seconds of the second
    (warm) pass, and the CPU seconds the JVM used in all (start-up and both passes)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    output = subprocess.run(
        [
            "java",
            "-cp",
            _JVM_CLASSPATH.read_text().strip(),
            str(_JVM_LOOP),
            url,
            str(per_topic),
            "2",
            *topics,
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    if output.returncode != 0:
        raise RuntimeError(f"the Java client's loop failed:\n{output.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    seconds, size = output.stdout.strip().splitlines()[-1].split()
    assert int(size) == len(PAYLOAD) * per_topic * len(topics), output.stdout
    return float(seconds), cpu_s


def measure(
    spark: SparkSession,
    client: pulsar.Client,
    url: str,
    messages: int,
    topics: int,
    repeat: int,
    broker_pid: int | None,
    workloads: list[str],
    paths: list[str],
    jvm: bool,
) -> dict[str, Any]:
    """Every side (the plain loop, then each workload on each read path) ``repeat`` times,
    in an order that rotates from round to round."""
    per_topic = messages // topics
    names = [f"bench-spark-{uuid.uuid4().hex[:8]}-{i}" for i in range(topics)]
    for name in names:
        fill(client, name, per_topic)
    total = per_topic * topics
    sides: dict[str, Callable[[], float]] = {"plain": lambda: plain_loop(client, names, per_topic)}
    jvm_cpu_s: list[float] = []
    if jvm:

        def jvm_side() -> float:
            seconds, cpu_s = jvm_loop(url, names, per_topic)
            jvm_cpu_s.append(cpu_s)
            return seconds

        sides["jvm"] = jvm_side
    for workload in workloads:
        for path in paths:
            run = WORKLOADS[workload]
            sides[f"{workload}/{path}"] = partial(run, spark, url, names, total, path)
    times: dict[str, list[float]] = {side: [] for side in sides}
    cpu_us: dict[str, list[float]] = {side: [] for side in sides}
    jit_us: dict[str, list[float]] = {side: [] for side in sides}
    loads: dict[str, list[float]] = {side: [] for side in sides}
    order = list(sides)
    for round_ in range(repeat):
        shift = round_ % len(order)
        for side in order[shift:] + order[:shift]:
            loads[side].append(os.getloadavg()[0])
            cpu_before, jit_before = _tree_cpu_s(broker_pid), _jit_cpu_s()
            seconds = sides[side]()
            times[side].append(seconds)
            cpu_us[side].append((_tree_cpu_s(broker_pid) - cpu_before) / total * 1e6)
            if side == "jvm":  # a child gone by now: its CPU from rusage, over both passes
                cpu_us[side][-1] = jvm_cpu_s[-1] / (2 * total) * 1e6
            jit_us[side].append((_jit_cpu_s() - jit_before) / total * 1e6)
            print(
                f"  {topics} topic(s) {side:<15} {total / seconds:>12,.0f} msg/s "
                f"{cpu_us[side][-1]:>6.1f} us CPU/msg ({jit_us[side][-1]:.1f} JVM JIT), "
                f"load {loads[side][-1]:.2f}",
                file=sys.stderr,
                flush=True,
            )
    median_s = {side: statistics.median(times[side]) for side in sides}
    return {
        "topics": topics,
        "messages": total,
        "seconds": times,
        "median_seconds": median_s,
        "msgs_per_s": {side: total / median_s[side] for side in sides},
        # How many times the plain loop's rate each side reads at.
        "ratio_to_plain": {side: median_s["plain"] / median_s[side] for side in sides},
        "cpu_us_per_msg": cpu_us,
        "cpu_us_per_msg_median": {side: statistics.median(cpu_us[side]) for side in sides},
        "jit_cpu_us_per_msg_median": {side: statistics.median(jit_us[side]) for side in sides},
        "load_average_1m": loads,
    }


# --- the first read of a fresh session ----------------------------------------------------


class _OneRow(DataSource):
    """The baseline: a Python data source that yields one row and does nothing else."""

    @classmethod
    def name(cls) -> str:
        return "one_row"

    def schema(self) -> str:
        return "value binary"

    def reader(self, schema: Any) -> DataSourceReader:
        return _OneRowReader()


class _OneRowReader(DataSourceReader):
    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[bytes]]:
        yield (b"x",)


def first_read_session(source: str, url: str, topic: str, master: str) -> dict[str, float]:
    """In this (fresh) process: seconds to start a session, then for its first and second
    ``load()`` + ``count()`` of one row from ``source`` ("pulsar" or "baseline")."""
    started = time.perf_counter()
    spark = spark_session(master, f"magnetar-bench-first-read-{source}", _SESSION_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(_OneRow)
    timings = {"session_s": time.perf_counter() - started}
    for attempt in ("first_read_s", "second_read_s"):
        started = time.perf_counter()
        if source == "pulsar":
            frame = spark.read.format("pulsar").option("service.url", url).option("topic", topic)
        else:
            frame = spark.read.format("one_row")
        assert frame.load().count() == 1
        timings[attempt] = time.perf_counter() - started
    spark.stop()
    return timings


def measure_first_reads(url: str, client: pulsar.Client, sessions: int, master: str) -> Any:
    topic = f"bench-spark-first-{uuid.uuid4().hex[:8]}"
    client.create_producer(topic).send(PAYLOAD)
    runs: dict[str, list[dict[str, float]]] = {"pulsar": [], "baseline": []}
    for round_ in range(sessions):
        for source in ("pulsar", "baseline") if round_ % 2 == 0 else ("baseline", "pulsar"):
            output = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--first-read-session",
                    source,
                    "--broker-url",
                    url,
                    "--topic",
                    topic,
                    "--master",
                    master,
                ],
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            ).stdout
            timings = json.loads(output.strip().splitlines()[-1])
            runs[source].append(timings)
            print(f"  first read {source:<8} {timings}", file=sys.stderr, flush=True)

    def median(source: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[source])

    return {
        "sessions": sessions,
        "runs": runs,
        "pulsar_first_read_s": median("pulsar", "first_read_s"),
        "baseline_first_read_s": median("baseline", "first_read_s"),
        "pulsar_second_read_s": median("pulsar", "second_read_s"),
        "baseline_second_read_s": median("baseline", "second_read_s"),
        "data_source_first_read_cost_s": median("pulsar", "first_read_s")
        - median("baseline", "first_read_s"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--topics", default="1,4", help="comma-separated topic counts")
    parser.add_argument(
        "--workloads", default="count,groupBy,stream", help=f"some of {', '.join(WORKLOADS)}"
    )
    parser.add_argument(
        "--paths", default="python,native", help="the read paths (magnetar.readPath) to compare"
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--first-reads", type=int, default=3, help="fresh sessions of each")
    parser.add_argument("--warm-up-reads", type=int, default=1, help="Spark reads before timing")
    parser.add_argument(
        "--jvm",
        action="store_true",
        help="add the Java client's loop (needs java and Maven's jars; Apache Pulsar only: "
        "pulsar-lite 0.2 sends the Java client's readers nothing)",
    )
    parser.add_argument("--broker", choices=("lite", "apache"), default="lite")
    parser.add_argument("--broker-url", help="a running broker instead")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument(
        "--output", default=str(ROOT / "bench" / "results" / "spark_read_throughput.json")
    )
    parser.add_argument("--first-read-session", choices=("pulsar", "baseline"), help="internal")
    parser.add_argument("--topic", help="internal: the one-message topic of a first read")
    args = parser.parse_args()
    if args.first_read_session:
        print(
            json.dumps(
                first_read_session(
                    args.first_read_session, args.broker_url, args.topic, args.master
                )
            )
        )
        return
    topic_counts = [int(n) for n in args.topics.split(",") if n]

    data_dir = tempfile.mkdtemp(prefix="magnetar-bench-")
    broker: EmbeddedBroker | ApachePulsarStandalone | None = None
    spark = None
    client = None
    try:
        url = args.broker_url
        if url is None and args.broker == "apache":
            broker = ApachePulsarStandalone(Path(data_dir), heap_mb=1024).start()
            url = broker.service_url
        elif url is None:
            broker = EmbeddedBroker(data_dir).start()
            url = broker.service_url
        client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        results: dict[str, Any] = {
            "messages": args.messages,
            "workloads": args.workloads,
            "paths": args.paths,
            "payload_bytes": len(PAYLOAD),
            "repeat": args.repeat,
            "warm_up_reads": args.warm_up_reads,
            "master": args.master,
            "broker": "given" if args.broker_url else args.broker,
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        }
        if args.first_reads:
            results["first_read"] = measure_first_reads(url, client, args.first_reads, args.master)
        if topic_counts:
            spark = spark_session(args.master, "magnetar-bench-spark-read", _SESSION_CONF)
            spark.sparkContext.setLogLevel("ERROR")
            # As many topics as the widest run, so every Python worker has started.
            warm_up = [
                f"bench-spark-warm-up-{uuid.uuid4().hex[:8]}-{i}" for i in range(max(topic_counts))
            ]
            for name in warm_up:
                fill(client, name, 10_000)
            for _ in range(args.warm_up_reads):
                spark_count(spark, url, warm_up, 10_000 * len(warm_up))
            results["runs"] = [
                measure(
                    spark,
                    client,
                    url,
                    args.messages,
                    topics,
                    args.repeat,
                    broker.pid if broker is not None else None,
                    [w for w in args.workloads.split(",") if w],
                    [p for p in args.paths.split(",") if p],
                    args.jvm and jvm_available(),
                )
                for topics in topic_counts
            ]
        results["load_average_end"] = os.getloadavg()
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2))
        _print(results)
        print(f"\nwritten to {output}")
    finally:
        if spark is not None:
            spark.stop()
        if client is not None:
            client.close()
        if broker is not None:
            broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def _print(results: dict[str, Any]) -> None:
    first = results.get("first_read")
    if first:
        print(
            f"\nfirst read of a fresh session (median of {first['sessions']}): pulsar "
            f"{first['pulsar_first_read_s']:.2f} s, a do-nothing Python data source "
            f"{first['baseline_first_read_s']:.2f} s: the pulsar data source adds "
            f"{first['data_source_first_read_cost_s']:+.2f} s; second reads "
            f"{first['pulsar_second_read_s']:.2f} s / {first['baseline_second_read_s']:.2f} s"
        )
    if results.get("runs"):
        print(
            f"\n{'topics':>6} {'side':<15} {'msg/s':>12} {'x plain':>8} "
            f"{'CPU us/msg (JIT)':>17} (medians of {results['repeat']})"
        )
        for run in results["runs"]:
            for side, rate in run["msgs_per_s"].items():
                print(
                    f"{run['topics']:>6} {side:<15} {rate:>12,.0f} "
                    f"{run['ratio_to_plain'][side]:>8.2f} "
                    f"{run['cpu_us_per_msg_median'][side]:>9.1f} "
                    f"({run['jit_cpu_us_per_msg_median'][side]:.1f})"
                )
            for workload in WORKLOADS:
                native = run["median_seconds"].get(f"{workload}/native")
                python = run["median_seconds"].get(f"{workload}/python")
                if native and python:
                    print(f"{run['topics']:>6} {workload}: native is {python / native:.2f}x python")
        start, end = results["load_average"], results["load_average_end"]
        print(
            f"load average (1, 5, 15 min) at the start {start[0]:.2f} {start[1]:.2f} "
            f"{start[2]:.2f}, at the end {end[0]:.2f} {end[1]:.2f} {end[2]:.2f}; "
            f"{results['cpus']} CPUs"
        )


if __name__ == "__main__":
    main()
