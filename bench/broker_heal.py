"""The embedded broker's healer: a Shared consumer killed -9 mid-stream, with and without healing.

Each run: an embedded pulsar-lite broker, a Shared subscription with two live consumers in
this process and one in a child process that never acknowledges (so everything it is handed
must come back to the others), and a steady stream. A third of the way in, the child is
stopped (SIGSTOP) for ``--pause`` seconds, so that the broker's writes pile up unread in its
socket, then killed (SIGKILL): its connection ends in a reset. pulsar-lite cleans up after it
when it meets the reset while writing, and never when it meets it while reading (see
magnetar/broker_healer.py); the run records which (``healed``: the healer restarted the broker).

Measured per run, from the kill: ``recovered_s``, until every input sent before the kill has
reached a live consumer (what the dead one held included); ``longest_gap_s``, the longest
pause in the live consumers' deliveries; ``missing`` inputs at the end (after ``--wait`` s);
``duplicates``. Baseline: the same runs without the healer, alternating in one run.

    python bench/broker_heal.py [--runs 5] [--rate 2000] [--seconds 6]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pulsar

from magnetar.broker import EmbeddedBroker
from magnetar.client import create_client, subscribe

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import sys, pulsar
from magnetar.client import create_client, subscribe
client = create_client(sys.argv[1])
consumer = subscribe(client, sys.argv[2], "bench", consumer_type=pulsar.ConsumerType.Shared,
                     receiver_queue_size=100_000, consumer_name="doomed")
print("subscribed", flush=True)
while True:
    consumer.receive()  # and never acknowledge
"""


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class LiveConsumers:
    """Shared consumers in this process that acknowledge everything, noting when it came."""

    def __init__(self, client: pulsar.Client, topic: str, count: int) -> None:
        self.received: Counter[int] = Counter()
        self.times: list[float] = []
        self.first_seen: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumers = [
            subscribe(
                client,
                topic,
                "bench",
                consumer_type=pulsar.ConsumerType.Shared,
                consumer_name=f"live-{index}",
            )
            for index in range(count)
        ]
        self._threads = [
            threading.Thread(target=self._drain, args=(c,), daemon=True) for c in self._consumers
        ]
        for thread in self._threads:
            thread.start()

    def _drain(self, consumer: Any) -> None:
        while not self._stop.is_set():
            try:
                message = consumer.receive(100)
            except pulsar.Timeout:
                continue
            consumer.acknowledge(message)
            now = time.monotonic()
            value = int(message.data())
            with self._lock:
                self.received[value] += 1
                self.times.append(now)
                self.first_seen.setdefault(value, now)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        for consumer in self._consumers:
            consumer.close()


def one_run(heal: bool, rate: float, seconds: float, pause: float, wait: float) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="magnetar-bench-heal-"))
    topic = f"persistent://public/default/heal-{uuid.uuid4().hex[:8]}"
    child = None
    try:
        with EmbeddedBroker(root / "broker", heal=heal) as broker:
            client = create_client(broker.service_url)
            live = LiveConsumers(client, topic, 2)
            child = subprocess.Popen(
                [sys.executable, "-c", _CHILD, broker.service_url, topic],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert child.stdout is not None and child.stdout.readline().strip() == "subscribed"
            producer = client.create_producer(
                topic,
                batching_enabled=True,
                batching_max_publish_delay_ms=5,
                block_if_queue_full=True,
            )
            total = int(rate * seconds)
            kill_at = total // 3
            killed = 0.0
            started = time.monotonic()
            for index in range(total):
                producer.send_async(str(index).encode(), None)
                if index == kill_at:
                    child.send_signal(signal.SIGSTOP)
                    time.sleep(pause)
                    child.send_signal(signal.SIGKILL)
                    child.wait()
                    killed = time.monotonic()
                    started += pause
                ahead = started + (index + 1) / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            producer.flush()
            deadline = time.monotonic() + wait
            while len(live.received) < total and time.monotonic() < deadline:
                time.sleep(0.05)
            live.close()
            heals = broker.heals
            client.close()
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        shutil.rmtree(root, ignore_errors=True)
    before_kill = range(kill_at + 1)
    recovered = (
        max(live.first_seen[i] for i in before_kill) - killed
        if all(i in live.first_seen for i in before_kill)
        else None
    )
    after = sorted(t for t in live.times if t >= killed)
    points = [killed, *after]
    return {
        "heal": heal,
        "healed": len(heals),
        "heal_s": [h.took_s for h in heals],
        "inputs": total,
        "recovered_s": recovered,
        "longest_gap_s": max(b - a for a, b in itertools.pairwise(points)) if after else None,
        "missing": total - len(live.received),
        "duplicates": sum(n - 1 for n in live.received.values()),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    recovered = [r["recovered_s"] for r in runs if r["recovered_s"] is not None]
    gaps = [r["longest_gap_s"] for r in runs if r["longest_gap_s"] is not None]
    return {
        "runs": len(runs),
        "runs_healed": sum(1 for r in runs if r["healed"]),
        "runs_with_missing": sum(1 for r in runs if r["missing"]),
        "missing_total": sum(r["missing"] for r in runs),
        "duplicates_median": statistics.median(r["duplicates"] for r in runs),
        "recovered_median_s": statistics.median(recovered) if recovered else None,
        "recovered_max_s": max(recovered) if recovered else None,
        "longest_gap_median_s": statistics.median(gaps) if gaps else None,
        "longest_gap_max_s": max(gaps) if gaps else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each side")
    parser.add_argument("--rate", type=float, default=2000, help="inputs per second")
    parser.add_argument("--seconds", type=float, default=6, help="length of the stream")
    parser.add_argument("--pause", type=float, default=0.3, help="SIGSTOP before the SIGKILL")
    parser.add_argument("--wait", type=float, default=10, help="wait for the rest, seconds")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "broker_heal.json"))
    args = parser.parse_args()

    runs: dict[str, list[dict[str, Any]]] = {"healer": [], "no_healer": []}
    for index in range(args.runs):
        for side in ("healer", "no_healer") if index % 2 == 0 else ("no_healer", "healer"):
            run = one_run(side == "healer", args.rate, args.seconds, args.pause, args.wait)
            runs[side].append(run)
            progress(
                f"  {side:<9} run {index + 1}: healed {run['healed']}, recovered "
                f"{_s(run['recovered_s'])}, gap {_s(run['longest_gap_s'])}, "
                f"missing {run['missing']}, duplicates {run['duplicates']}"
            )
    results = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "settings": vars(args),
        "definitions": {
            "recovered_s": "kill -> every input sent before the kill reached a live consumer",
            "longest_gap_s": "longest pause in the live consumers' deliveries after the kill",
            "healed": "restarts by the healer (0: pulsar-lite cleaned up by itself)",
        },
        "healer": {"summary": summarize(runs["healer"]), "runs": runs["healer"]},
        "no_healer": {"summary": summarize(runs["no_healer"]), "runs": runs["no_healer"]},
    }
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2))
    print(
        f"\n{'':<10} {'healed':>6} {'missing runs':>12} {'recovered med/max s':>20} "
        f"{'gap med/max s':>14} {'dup med':>7}"
    )
    for side in ("healer", "no_healer"):
        s = results[side]["summary"]
        print(
            f"{side:<10} {s['runs_healed']:>6} {s['runs_with_missing']:>12} "
            f"{_s(s['recovered_median_s']):>10}/{_s(s['recovered_max_s']):<9} "
            f"{_s(s['longest_gap_median_s']):>6}/{_s(s['longest_gap_max_s']):<7} "
            f"{s['duplicates_median']:>7}"
        )
    print(f"\nwritten to {output}")


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    main()
