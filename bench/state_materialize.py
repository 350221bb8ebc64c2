"""Materialization rate: a state journal replayed into a fresh RocksDB table, against merely
reading the same journal (the baseline), in the same run.

The journal holds what instances write: messages of 500 records (one per input), each with
``--ops`` counter increments over ``--keys`` keys. Target: >= 100k updates/s.

    python bench/state_materialize.py [--updates 1000000] [--repeat 3] [--broker-url URL]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pulsar

from magnetar.broker import EmbeddedBroker
from magnetar.statestore import StateTable, journal_topic
from magnetar.statestore.records import INCR, encode_message, encode_record

ROOT = Path(__file__).resolve().parent.parent


def write_journal(
    client: pulsar.Client, topic: str, updates: int, ops: int, keys: int
) -> tuple[int, int]:
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    seq, written, messages, records = 0, 0, 0, []
    while written < updates:
        seq += 1
        record_ops = [(INCR, f"key-{(written + i) % keys}".encode(), 1) for i in range(ops)]
        records.append(
            encode_record(seq, b"persistent://public/default/in", (1, seq, -1), record_ops)
        )
        written += ops
        if len(records) == 500 or written >= updates:
            producer.send_async(encode_message(1, 0, True, records), None)
            messages += 1
            records = []
    producer.flush()
    producer.close()
    return written, messages


def read_only(client: pulsar.Client, topic: str, messages: int) -> float:
    """Read every journal message and its payload (reopening a reader that stalls, as the
    table's tailer does)."""
    last: Any = pulsar.MessageId.earliest
    reader = client.create_reader(topic, last, receiver_queue_size=5000)
    started = time.perf_counter()
    read = 0
    while read < messages:
        try:
            message = reader.read_next(2000)
        except pulsar.Timeout:
            reader.close()
            reader = client.create_reader(topic, last, receiver_queue_size=5000)
            continue
        message.data()
        last = message.message_id()
        read += 1
    elapsed = time.perf_counter() - started
    reader.close()
    return elapsed


def materialize(client: pulsar.Client, topic: str, work: Path) -> tuple[float, int]:
    started = time.perf_counter()
    table = StateTable(client, topic, work / uuid.uuid4().hex).start()
    table.catch_up(600)
    elapsed = time.perf_counter() - started
    applied = table.applied_ops
    table.stop()
    return elapsed, applied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--ops", type=int, default=5, help="updates per record (input)")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--broker-url")
    parser.add_argument(
        "--output", default=str(ROOT / "bench" / "results" / "state_materialize.json")
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="magnetar-bench-materialize-"))
    broker = None
    try:
        url = args.broker_url
        if url is None:
            broker = EmbeddedBroker(work / "broker").start()
            url = broker.service_url
        client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        topic = journal_topic(f"public/default/bench-{uuid.uuid4().hex[:6]}")
        updates, messages = write_journal(client, topic, args.updates, args.ops, args.keys)
        rates: dict[str, list[float]] = {"read_only": [], "materialize": []}
        for _ in range(args.repeat):
            rates["read_only"].append(updates / read_only(client, topic, messages))
            elapsed, applied = materialize(client, topic, work)
            assert applied == updates, (applied, updates)
            rates["materialize"].append(updates / elapsed)
            print(
                f"  read {rates['read_only'][-1]:>12,.0f} updates/s   materialize "
                f"{rates['materialize'][-1]:>12,.0f} updates/s",
                file=sys.stderr,
                flush=True,
            )
        client.close()
        result: dict[str, Any] = {
            "updates": updates,
            "updates_per_record": args.ops,
            "keys": args.keys,
            "read_only_rates": rates["read_only"],
            "materialize_rates": rates["materialize"],
            "read_only_median": statistics.median(rates["read_only"]),
            "materialize_median": statistics.median(rates["materialize"]),
        }
        result["ratio"] = result["materialize_median"] / result["read_only_median"]
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=2))
        print(
            f"\nmaterialized {result['materialize_median']:,.0f} updates/s (target >= 100,000); "
            f"reading alone {result['read_only_median']:,.0f}/s; ratio {result['ratio']:.2f}\n"
            f"written to {output}"
        )
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
