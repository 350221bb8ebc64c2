"""The brokers a benchmark runs on, side by side in one run: the embedded pulsar-lite and an
Apache Pulsar standalone (``make apache-pulsar``), each started fresh with its defaults; or a
broker that runs already (``--broker-url``, with ``--pulsar-admin-url`` if it is Apache)."""

from __future__ import annotations

import argparse
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar

from magnetar.broker import EmbeddedBroker
from magnetar.testing import ApachePulsarStandalone

BROKERS = ("lite", "apache")


@dataclass(frozen=True)
class Broker:
    name: str
    """``lite``, ``apache`` or ``given``."""
    service_url: str
    admin_url: str | None
    """The admin API (Apache Pulsar's), which workers are given as ``--pulsar-admin-url``."""
    description: str


def add_broker_options(parser: argparse.ArgumentParser, default: str = "both") -> None:
    parser.add_argument(
        "--broker",
        choices=(*BROKERS, "both"),
        default=default,
        help=f"the broker(s) to run on, one after the other [default: {default}]",
    )
    parser.add_argument("--broker-url", help="a running broker instead (overrides --broker)")
    parser.add_argument("--pulsar-admin-url", help="its admin API, if it is Apache Pulsar")


def chosen(args: argparse.Namespace) -> list[str]:
    """The brokers ``--broker`` names (``given`` with ``--broker-url``)."""
    if args.broker_url:
        return ["given"]
    return list(BROKERS) if args.broker == "both" else [args.broker]


@contextmanager
def running(name: str, args: argparse.Namespace) -> Iterator[Broker]:
    """``name``'s broker, started in a temporary directory and stopped afterwards."""
    if name == "given":
        yield Broker(name, args.broker_url, args.pulsar_admin_url, args.broker_url)
        return
    with tempfile.TemporaryDirectory(prefix=f"magnetar-bench-{name}-") as data_dir:
        if name == "lite":
            with EmbeddedBroker(Path(data_dir)) as lite:
                yield Broker(name, lite.service_url, None, "embedded pulsar-lite, defaults")
            return
        with ApachePulsarStandalone(Path(data_dir), heap_mb=1024) as apache:
            warm_up(apache.service_url)
            yield Broker(
                name,
                apache.service_url,
                apache.admin_url,
                f"Apache Pulsar standalone, 1 GiB heap, started in {apache.startup_s:.1f} s",
            )


def warm_up(service_url: str, messages: int = 30_000) -> None:
    """Send and read ``messages`` through a fresh JVM broker, so that the measurements see it
    compiled (the first runs on a cold JIT were a third as fast), as a long-running one is."""
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        topic = f"warm-up-{uuid.uuid4().hex[:8]}"
        consumer = client.subscribe(topic, "warm-up")
        producer = client.create_producer(topic, block_if_queue_full=True)
        for _ in range(messages):
            producer.send_async(b"x" * 100, None)
        producer.flush()
        for _ in range(messages):
            consumer.acknowledge(consumer.receive(10_000))
    finally:
        client.close()


def side_by_side(results: dict[str, Any], path: tuple[str, ...]) -> dict[str, float] | None:
    """``apache / lite`` of the number at ``path`` in both brokers' results, if both ran."""

    def pick(name: str) -> float | None:
        value: Any = results.get(name)
        for key in path:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return float(value) if isinstance(value, int | float) else None

    lite, apache = pick("lite"), pick("apache")
    if lite is None or apache is None or lite == 0:
        return None
    return {"lite": lite, "apache": apache, "apache_over_lite": apache / lite}
