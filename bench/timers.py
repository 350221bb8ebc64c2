"""Timers on one instance (a Python function with its journaled state store), on the
embedded pulsar-lite:

* arming rate: inputs that each arm one timer (due in an hour), processed per second: the
  timer's two keys and the pending count journaled with each input, which is acknowledged
  once its record is persisted;
* firing rate: as many timers, all due at once, fired per second (each callback returns a
  small output, sent and persisted before its timer is removed);
* lateness p50/p99 at a steady 1,000 firings/s: timers due one millisecond apart, fired as
  they fall due (the lateness the instance measures, due time to callback).

With ``--pending N``, also the memory (RSS of this process: the instance, its client and
its RocksDB) of an instance holding N pending timers against the same instance before it
armed any. ``--broker apache --guarantees EFFECTIVELY_ONCE`` measures the exactly-once
firings (``timer_once``) on an Apache Pulsar standalone, its output deduplicated.

    python bench/timers.py [--timers 20000] [--steady-s 5] [--pending 1000000]
                           [--broker lite|apache] [--guarantees EFFECTIVELY_ONCE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pulsar
from _brokers import Broker, add_broker_options, chosen, running
from _throughput import ROOT

from magnetar.instance import FunctionConfig, FunctionInstance, InstanceOptions
from magnetar.statestore import JournaledStateStore, StateOptions
from magnetar.worker.broker_admin import BrokerAdmin

CODE = '''
import time

from pulsar import Function


class Alarm(Function):
    """Each input "<reference> <due ms>" arms a timer; its callback returns the reference."""

    def process(self, input, context):
        reference, due_ms = input.split()
        context.create_timer(self.ring, int(due_ms) / 1000, reference, reference)

    def ring(self, payload, context):
        return payload
'''


def _send(client: pulsar.Client, topic: str, lines: list[str]) -> None:
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=1000, block_if_queue_full=True
    )
    for line in lines:
        producer.send_async(line.encode(), None)
    producer.flush()
    producer.close()


def _wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.002)


def _phase(
    client: pulsar.Client,
    broker: Broker,
    work: Path,
    code: Path,
    count: int,
    steady_s: float,
    guarantees: str,
) -> Any:
    topic = f"alarms-{uuid.uuid4().hex[:6]}"
    config = FunctionConfig(
        name=f"alarm-{uuid.uuid4().hex[:6]}",
        py=str(code),
        class_name="alarm.Alarm",
        inputs=[topic],
        output=f"{topic}-out",
        subscription_position="Earliest",
        processing_guarantees=guarantees,
    )
    effectively_once = guarantees == "EFFECTIVELY_ONCE"
    if broker.admin_url and effectively_once:  # as a worker does for such a function
        admin = BrokerAdmin(broker.admin_url)
        admin.create_topic(f"persistent://public/default/{topic}-out")
        admin.enable_deduplication(f"persistent://public/default/{topic}-out")
        admin.close()
    # a namespace Apache Pulsar has from the start (a worker creates its own)
    options = StateOptions(str(work / "state"), namespace="public/default")
    state = JournaledStateStore(client, config.fqfn, options, effectively_once)
    instance_options = InstanceOptions(broker_may_deduplicate=broker.admin_url is not None)
    instance = FunctionInstance(config, client, instance_options, state=state).start()
    metrics = instance.metrics
    try:
        # arming: due in an hour, so nothing fires meanwhile
        later_ms = int(time.time() * 1000) + 3_600_000
        started = time.perf_counter()
        _send(client, topic, [f"a{i} {later_ms + i}" for i in range(count)])
        _wait(lambda: metrics.processed >= count, 600, "arming")
        arming_s = time.perf_counter() - started

        # firing: re-arm them all due now
        now_ms = int(time.time() * 1000) + 1500
        _send(client, topic, [f"a{i} {now_ms}" for i in range(count)])
        _wait(lambda: metrics.processed >= 2 * count, 600, "re-arming")
        _wait(lambda: metrics.timers_fired >= 1, 600, "the first firing")
        started = time.perf_counter()
        _wait(lambda: metrics.timers_fired >= count, 600, "firing")
        firing_s = time.perf_counter() - started

        # steady: 1,000 firings a second, armed ahead
        steady = int(steady_s * 1000)
        start_ms = int(time.time() * 1000) + 3000
        _send(client, topic, [f"s{i} {start_ms + i}" for i in range(steady)])
        _wait(lambda: metrics.timers_fired >= count + steady, 120 + steady_s, "steady firings")
        lateness = sorted(list(metrics.timer_lateness_ms)[-min(steady, 4000) :])
    finally:
        instance.stop()
        instance.wait(30)
        state.close()
    return {
        "timers": count,
        "arming_per_s": round(count / arming_s),
        "firing_per_s": round((count - 1) / firing_s) if firing_s else None,
        "steady_firings_per_s": 1000,
        "steady_lateness_ms": {
            "p50": lateness[len(lateness) // 2],
            "p99": lateness[int(len(lateness) * 0.99) - 1],
            "max": lateness[-1],
            "mean": round(statistics.fmean(lateness), 1),
            "samples": len(lateness),
        },
    }


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pending(client: pulsar.Client, work: Path, code: Path, count: int) -> Any:
    topic = f"pending-{uuid.uuid4().hex[:6]}"
    config = FunctionConfig(
        name=f"pending-{uuid.uuid4().hex[:6]}",
        py=str(code),
        class_name="alarm.Alarm",
        inputs=[topic],
        subscription_position="Earliest",
    )
    options = StateOptions(str(work / "pending-state"), namespace="public/default")
    state = JournaledStateStore(client, config.fqfn, options)
    instance = FunctionInstance(config, client, InstanceOptions(), state=state).start()
    try:
        time.sleep(2)
        before = _rss_mb()
        later_ms = int(time.time() * 1000) + 86_400_000
        started = time.perf_counter()
        step = 100_000
        for first in range(0, count, step):
            lines = [f"p{i} {later_ms + i}" for i in range(first, min(count, first + step))]
            _send(client, topic, lines)
            done = first + len(lines)
            _wait(lambda done=done: instance.metrics.processed >= done, 900, "arming")
        arming_s = time.perf_counter() - started
        time.sleep(5)  # the table flushed, the instance idle with its timers
        after = _rss_mb()
    finally:
        instance.stop()
        instance.wait(60)
        state.close()
    return {
        "pending": count,
        "arming_per_s": round(count / arming_s),
        "rss_mb_without": round(before),
        "rss_mb_with": round(after),
        "rss_mb_added": round(after - before),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--timers", type=int, default=20_000)
    parser.add_argument("--steady-s", type=float, default=5.0)
    parser.add_argument("--pending", type=int, default=0)
    parser.add_argument(
        "--guarantees", choices=("ATLEAST_ONCE", "EFFECTIVELY_ONCE"), default="ATLEAST_ONCE"
    )
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "timers.json"))
    add_broker_options(parser, default="lite")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="magnetar-bench-timers-"))
    try:
        code = work / "alarm.py"
        code.write_text(CODE)
        with running(chosen(args)[0], args) as broker:
            client = pulsar.Client(
                broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
            )
            try:
                result = _phase(
                    client, broker, work, code, args.timers, args.steady_s, args.guarantees
                )
                if args.pending:
                    result["memory"] = _pending(client, work, code, args.pending)
            finally:
                client.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["broker"] = broker.description
    result["guarantees"] = args.guarantees
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
