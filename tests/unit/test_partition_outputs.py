"""EFFECTIVELY_ONCE output producers per input partition: named after the partition, a busy
name waited for, idle ones let go. The broker side is a test seam: ``create`` is the only
thing PartitionOutputs asks of the client."""

from __future__ import annotations

import threading
import time

import pulsar
import pytest

from magnetar.instance.exceptions import InstanceError
from magnetar.instance.partition_outputs import PartitionOutputs


class FakeProducer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False
        self.flushed = False

    def flush(self) -> None:
        self.flushed = True

    def close(self) -> None:
        self.closed = True

    def last_sequence_id(self) -> int:
        return -1


class Names:
    """Producer names a broker hands out; ``busy`` ones are refused as held elsewhere."""

    def __init__(self) -> None:
        self.created: list[FakeProducer] = []
        self.busy: dict[str, int] = {}
        """Name -> how many more requests for it are refused."""

    def create(self, name: str) -> FakeProducer:
        if self.busy.get(name, 0) > 0:
            self.busy[name] -= 1
            raise pulsar.ProducerBusy("Producer with name is already connected")
        producer = FakeProducer(name)
        self.created.append(producer)
        return producer


def test_one_producer_per_input_partition_named_after_it() -> None:
    names = Names()
    outputs = PartitionOutputs(names.create, threading.Event(), idle_close_s=60, remembered=100)

    first = outputs.producer("persistent://public/default/in-partition-0")
    assert outputs.producer("persistent://public/default/in-partition-0") is first
    outputs.producer("persistent://public/default/in-partition-1")

    assert [p.name for p in names.created] == [
        "persistent://public/default/in-partition-0",
        "persistent://public/default/in-partition-1",
    ]


def test_a_name_still_held_elsewhere_is_asked_for_again() -> None:
    names = Names()
    names.busy["in"] = 3
    outputs = PartitionOutputs(names.create, threading.Event(), idle_close_s=60, remembered=100)

    producer = outputs.producer("in")

    assert producer.name == "in" and names.busy["in"] == 0


def test_a_stop_ends_the_wait_for_a_busy_name_with_an_error() -> None:
    names = Names()
    names.busy["in"] = 1_000_000
    stopping = threading.Event()
    outputs = PartitionOutputs(names.create, stopping, idle_close_s=60, remembered=100)
    threading.Timer(0.3, stopping.set).start()

    with pytest.raises(InstanceError, match="stopped while waiting for output producer in"):
        outputs.producer("in")
    assert names.created == []


def test_producers_of_quiet_partitions_are_flushed_and_closed() -> None:
    names = Names()
    outputs = PartitionOutputs(names.create, threading.Event(), idle_close_s=0.2, remembered=100)
    quiet = outputs.producer("quiet")
    busy = outputs.producer("busy")

    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:
        outputs.producer("busy")  # keeps being used
        outputs.close_idle()
        time.sleep(0.02)

    assert quiet.flushed and quiet.closed
    assert not busy.closed
    assert outputs.producers() == [busy]
    again = outputs.producer("quiet")  # reopened on its next output
    assert again is not quiet and not again.closed
