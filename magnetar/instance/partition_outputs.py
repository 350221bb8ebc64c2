"""EFFECTIVELY_ONCE outputs: one output producer per input partition, named after it.

The broker deduplicates by producer *name*: it remembers the highest sequence id stored for
each name and drops a message that is not above it. An output's sequence id grows with its
input's position (see ``output_sequence``), which only holds within one input partition, so
each input partition's outputs go through a producer of their own, named after the partition
as Apache Pulsar's instances name it (``PulsarSinkEffectivelyOnceProcessor``). An instance that
takes a partition over after a crash reopens the name, and the broker drops the outputs of
the inputs its predecessor had processed but not acknowledged. These producers do not batch:
the broker keeps one sequence id per entry, and of a batch from this client the lowest, so after
a crash it would take the rest of the last batch for new outputs (stored twice), and drop a
batch holding both stored and new outputs whole (new ones lost); both were measured.

Only one producer may hold a name. On a Failover subscription the partition's previous
consumer may still hold it for a moment (it lost the partition but is alive, or its
connection is not closed yet), so a busy name is asked for again until it is free. The Python
client cannot tell an instance that its consumer became inactive, so a producer idle for
``idle_close_s`` is closed: an instance that lost the partition to another lets the name go
within that time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulsar

from magnetar.instance.exceptions import InstanceError
from magnetar.instance.output_sequence import OutputSequence

__all__ = ["PartitionOutputs"]

log = logging.getLogger(__name__)

_BUSY_RETRY_S = 0.1
_BUSY_LOG_EVERY_S = 5.0


@dataclass
class _Named:
    producer: Any
    last_used: float


class PartitionOutputs:
    """Output producers by input partition, created on first use, closed when idle."""

    def __init__(
        self,
        create: Callable[[str], Any],
        stopping: threading.Event,
        idle_close_s: float,
        remembered: int,
    ) -> None:
        """``create(name)``: a new producer on the output topic with that producer name;
        ``remembered``: how many sequence ids of a partition are kept (``OutputSequence``)."""
        self._sequence = OutputSequence(remembered)
        self._create = create
        self._stopping = stopping
        self._idle_close_s = idle_close_s
        self._producers: dict[str, _Named] = {}
        self._busy_until: dict[str, float] = {}
        self._next_idle_check = time.monotonic() + idle_close_s

    def producer(self, input_partition: str) -> Any:
        """The output producer of the inputs from ``input_partition`` (a full topic name)."""
        named = self._producers.get(input_partition)
        now = time.monotonic()
        if named is None:
            producer = self._open(input_partition)
            self._sequence.opened(input_partition, producer.last_sequence_id())
            named = self._producers[input_partition] = _Named(producer, now)
        else:
            named.last_used = now
        return named.producer

    def sequence_id(self, input_partition: str, message_id: Any) -> int:
        """The sequence id of the output of ``message_id``, an input from
        ``input_partition`` (see ``output_sequence``)."""
        if input_partition not in self._producers:  # (runners have opened it already)
            self.producer(input_partition)  # open: what its name held is known
        return self._sequence.next_id(input_partition, message_id)

    def try_producer(self, name: str) -> Any:
        """The producer named ``name``, or None while another producer holds the name (it
        is asked for again at most every ``_BUSY_RETRY_S``): for who may fire a lane of
        timers (see ``timer_once``), without waiting."""
        named = self._producers.get(name)
        now = time.monotonic()
        if named is not None:
            named.last_used = now
            return named.producer
        if now < self._busy_until.get(name, 0.0):
            return None
        try:
            producer = self._create(name)
        except pulsar.ProducerBusy:
            self._busy_until[name] = now + _BUSY_RETRY_S
            return None
        self._busy_until.pop(name, None)
        self._producers[name] = _Named(producer, now)
        return producer

    def close_idle(self) -> None:
        """Close the producers unused for ``idle_close_s``, so another instance that took
        their partition over can have the name."""
        now = time.monotonic()
        if now < self._next_idle_check:
            return
        self._next_idle_check = now + self._idle_close_s / 2
        for partition, named in list(self._producers.items()):
            if now - named.last_used >= self._idle_close_s:
                del self._producers[partition]
                _close(named.producer)

    def producers(self) -> list[Any]:
        return [named.producer for named in self._producers.values()]

    def close(self) -> None:
        for named in self._producers.values():
            _close(named.producer)
        self._producers.clear()

    def _open(self, name: str) -> Any:
        waiting_since = time.monotonic()
        logged = waiting_since
        while True:
            try:
                return self._create(name)
            except pulsar.ProducerBusy:
                pass
            now = time.monotonic()
            if now - logged >= _BUSY_LOG_EVERY_S:
                logged = now
                log.warning(
                    "output producer %s is still held by another producer (%.0f s): the "
                    "previous consumer of that input partition has not let it go yet",
                    name,
                    now - waiting_since,
                )
            if self._stopping.wait(_BUSY_RETRY_S):
                raise InstanceError(f"stopped while waiting for output producer {name}")


def _close(producer: Any) -> None:
    try:
        producer.flush()  # nothing of it may be left unsent: its inputs wait for the receipts
        producer.close()
    except pulsar.PulsarException as error:
        log.debug("closing an output producer failed: %s", error)
