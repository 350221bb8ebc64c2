"""A steady stream of numbered inputs into a function, and its outputs, checked one by one.

The producer blocks when its queue is full (``send_async`` would otherwise fail the excess
with ProducerQueueIsFull, which looks like lost messages) and counts every failed send.
Outputs are read from the start of the output topic and matched to their input by value (a
message the checker is handed again, as after a broker restart, counts once); their publish
times (set by the instance that produced them) show gaps in the output.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pulsar

__all__ = ["Stream"]


class Stream:
    """Numbered inputs ``m0, m1, ...`` into ``input_topic`` at ``rate`` per second (batched),
    from :meth:`start` until :meth:`stop`; the outputs of ``output_topic`` are collected
    meanwhile. ``input_of`` maps an output value back to its input (the exclamation example
    appends "!")."""

    def __init__(
        self,
        client: pulsar.Client,
        input_topic: str,
        output_topic: str,
        rate: float = 200.0,
        input_of: Callable[[str], str] = lambda output: output.removesuffix("!"),
    ) -> None:
        self.input_topic = input_topic
        self.rate = rate
        self.sent: list[str] = []
        self.failed_sends: Counter[str] = Counter()
        self.outputs: Counter[str] = Counter()
        self.output_times: list[float] = []
        """Publish time (seconds since the epoch) of every output, in arrival order."""
        self._output_ids: set[str] = set()
        self._input_of = input_of
        self._lock = threading.Lock()
        self._producing = threading.Event()
        self._closing = threading.Event()
        self._producer = client.create_producer(
            input_topic,
            block_if_queue_full=True,
            batching_enabled=True,
            batching_max_publish_delay_ms=5,
        )
        self._consumer = client.subscribe(
            output_topic,
            "stream-check",
            consumer_type=pulsar.ConsumerType.Exclusive,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        self._producer_thread = threading.Thread(target=self._produce, daemon=True)
        self._collector_thread = threading.Thread(target=self._collect, daemon=True)
        self._collector_thread.start()

    def start(self) -> Stream:
        self._producing.set()
        self._producer_thread.start()
        return self

    def stop(self) -> None:
        """Stop producing; returns once every input sent is acknowledged by the broker."""
        self._producing.clear()
        self._producer_thread.join()
        self._producer.flush()

    def close(self) -> None:
        self._closing.set()
        if self._producer_thread.is_alive():
            self.stop()
        self._collector_thread.join(5)
        self._producer.close()
        self._consumer.close()

    def _produce(self) -> None:
        started = time.monotonic()
        index = 0
        while self._producing.is_set():
            value = f"m{index}"
            self._producer.send_async(value.encode(), self._sent_callback)
            with self._lock:
                self.sent.append(value)
            index += 1
            ahead = started + index / self.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)

    def _sent_callback(self, result: Any, _message_id: Any) -> None:
        if result != pulsar.Result.Ok:
            with self._lock:
                self.failed_sends[str(result)] += 1

    def _collect(self) -> None:
        while not self._closing.is_set():
            try:
                message = self._consumer.receive(200)
            except pulsar.Timeout:
                continue
            except Exception:  # closed under us
                return
            self._consumer.acknowledge(message)
            source = self._input_of(message.data().decode())
            with self._lock:
                if str(message.message_id()) in self._output_ids:
                    continue
                self._output_ids.add(str(message.message_id()))
                self.outputs[source] += 1
                self.output_times.append(message.publish_timestamp() / 1000)

    def missing(self) -> list[str]:
        """Inputs sent that have no output (yet)."""
        with self._lock:
            return [value for value in self.sent if value not in self.outputs]

    def duplicates(self) -> int:
        """Outputs beyond the first for the same input."""
        with self._lock:
            return sum(count - 1 for count in self.outputs.values())

    def wait_complete(self, timeout: float) -> bool:
        """Whether every input sent has an output within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.missing():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def longest_gap(self, since: float, until: float) -> float:
        """The longest time without an output between ``since`` and ``until`` (seconds since
        the epoch), both ends included as if an output had been published then."""
        with self._lock:
            times = sorted(t for t in self.output_times if since <= t <= until)
        points = [since, *times, until]
        return max(later - earlier for earlier, later in itertools.pairwise(points))
