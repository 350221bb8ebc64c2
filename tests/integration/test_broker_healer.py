"""The embedded broker heals itself: a consumer killed with unread messages in its socket (its
connection ends in a reset pulsar-lite never cleans up), a restart under load, a broker crash.
Each test has a broker of its own, since they restart it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pulsar
import pytest

from magnetar.broker import EmbeddedBroker
from magnetar.broker_probe import check_broker
from magnetar.client import create_client, subscribe

pytestmark = pytest.mark.timeout(120)

_STOPPED_CONSUMER = """
import sys, pulsar
from magnetar.client import create_client, subscribe
client = create_client(sys.argv[1])
consumer = subscribe(client, sys.argv[2], "sub", consumer_type=pulsar.ConsumerType.Shared,
                     receiver_queue_size=500)
print("subscribed", flush=True)
sys.stdin.read()  # until killed; never receives, never acknowledges
"""


class Drain:
    """Shared consumers that acknowledge every message, counting them by value."""

    def __init__(self, client: pulsar.Client, topic: str, count: int = 2, **kwargs: object):
        self.received: Counter[bytes] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumers = [
            subscribe(client, topic, "sub", consumer_type=pulsar.ConsumerType.Shared, **kwargs)
            for _ in range(count)
        ]
        self._threads = [threading.Thread(target=self._run, args=(c,)) for c in self._consumers]
        for thread in self._threads:
            thread.start()

    def _run(self, consumer: pulsar.Consumer) -> None:
        while not self._stop.is_set():
            try:
                message = consumer.receive(100)
            except pulsar.Timeout:
                continue
            consumer.acknowledge(message)
            with self._lock:
                self.received[message.data()] += 1

    def wait_for(self, values: set[bytes], timeout: float) -> set[bytes]:
        """The values still missing after at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                missing = values - set(self.received)
            if not missing or time.monotonic() > deadline:
                return missing
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def test_messages_of_a_consumer_killed_with_unread_deliveries_reach_the_others(
    tmp_path: Path,
) -> None:
    with EmbeddedBroker(tmp_path) as broker:
        client = create_client(broker.service_url)
        topic = "healer-killed"
        child = subprocess.Popen(
            [sys.executable, "-c", _STOPPED_CONSUMER, broker.service_url, topic],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "subscribed"
        # Paused, it cannot read what the broker sends it: its socket holds the deliveries,
        # so its death is a reset the broker meets when it next reads.
        child.send_signal(signal.SIGSTOP)
        drain = Drain(client, topic)
        values = {f"v{i}".encode() for i in range(1500)}
        producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
        for value in sorted(values):
            producer.send_async(value, None)
        producer.flush()
        time.sleep(1)  # the broker is done writing to the paused consumer
        child.kill()
        child.wait()
        try:
            assert drain.wait_for(values, 20) == set()
        finally:
            drain.close()
        assert len(broker.heals) == 1
        assert "ended in a reset" in broker.heals[0].reason
        client.close()


def test_a_restart_under_load_loses_nothing(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path) as broker:
        client = create_client(broker.service_url)
        topic = "healer-restart"
        drain = Drain(client, topic, count=3)
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_publish_delay_ms=5, block_if_queue_full=True
        )
        values = [f"r{i}".encode() for i in range(6000)]
        failed: list[str] = []

        def sent(result: pulsar.Result, _message_id: object) -> None:
            if result != pulsar.Result.Ok:
                failed.append(str(result))

        for index, value in enumerate(values):
            producer.send_async(value, sent)
            if index == 2000:
                broker.restart()
            if index % 50 == 0:
                time.sleep(0.025)  # some 2,000 a second
        producer.flush()
        try:
            assert drain.wait_for(set(values), 20) == set()
        finally:
            drain.close()
        # a reader may see messages again after a reconnection, never one out of order:
        # skipping ids not greater than the last one read gives the topic once, in order
        read: list[bytes] = []
        last = None
        while len(read) < len(values):
            message = reader.read_next(10_000)
            if last is None or message.message_id() > last:
                last = message.message_id()
                read.append(message.data())
        assert read == values
        assert failed == []
        client.close()


def test_a_broker_that_dies_is_started_again(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path) as broker:
        client = create_client(broker.service_url)
        producer = client.create_producer("healer-crash")
        producer.send(b"before")
        pid = broker.pid
        assert pid is not None
        subprocess.run(["kill", "-9", str(pid)], check=True)
        deadline = time.monotonic() + 10
        while not broker.heals and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [h.reason for h in broker.heals] == ["pulsar-lite exited unexpectedly"]
        assert broker.pid != pid and broker.is_running()
        producer.send(b"after")  # the same producer, reconnected
        reader = client.create_reader("healer-crash", pulsar.MessageId.earliest)
        assert [reader.read_next(10_000).data() for _ in range(2)] == [b"before", b"after"]
        client.close()


def test_probing_the_broker_is_not_taken_for_a_dead_client(tmp_path: Path) -> None:
    # the CLI's quick check reads the broker's answer to its end before closing
    with EmbeddedBroker(tmp_path) as broker:
        for _ in range(3):
            check_broker(broker.service_url)
        time.sleep(0.5)  # more than the healer needs to notice
        assert broker.heals == []
