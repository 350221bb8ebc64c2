"""Fixtures for the state store: unique functions, journals written the way instances write
them, and tables on real RocksDB directories."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.statestore import StateTable, journal_topic, snapshot_topic
from magnetar.statestore.records import INCR, PUT, Op, encode_message, encode_record

OpenTable = Callable[..., StateTable]


@pytest.fixture
def fqfn() -> str:
    """A function name of its own, so each test has its own journal."""
    return f"public/default/state-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def open_table(client: pulsar.Client, fqfn: str, tmp_path: Path) -> Iterator[OpenTable]:
    """Start a StateTable of ``fqfn`` in ``tmp_path/<directory>``; stopped at teardown."""
    started: list[StateTable] = []

    def start(directory: str = "table", **kwargs: Any) -> StateTable:
        kwargs.setdefault("snapshot_topic", snapshot_topic(fqfn))
        table = StateTable(client, journal_topic(fqfn), tmp_path / directory, **kwargs).start()
        started.append(table)
        return table

    yield start
    for table in started:
        table.stop()


class Journal:
    """Writes journal messages as an instance does: records with input positions."""

    def __init__(self, client: pulsar.Client, topic: str, dedup: bool = False, epoch: int = 0):
        self.producer = client.create_producer(topic, batching_enabled=False)
        self.dedup = dedup
        self.epoch = epoch
        self.writer_id = uuid.uuid4().int & (2**64 - 1)
        self.seq = 0

    def send(
        self, *records: tuple[int, list[Op]], topic: str = "persistent://public/default/in"
    ) -> Any:
        """One message of records, each (input entry id, ops); returns its message id."""
        encoded = []
        for entry, ops in records:
            self.seq += 1
            encoded.append(encode_record(self.seq, topic.encode(), (7, entry, -1), ops))
        payload = encode_message(self.writer_id, self.epoch, self.dedup, encoded)
        return self.producer.send(payload)


@pytest.fixture
def journal(client: pulsar.Client, fqfn: str) -> Iterator[Callable[..., Journal]]:
    made: list[Journal] = []

    def make(**kwargs: Any) -> Journal:
        kwargs.setdefault("topic", journal_topic(fqfn))
        made.append(Journal(client, **kwargs))
        return made[-1]

    yield make
    for each in made:
        each.producer.close()


def incr(key: str, amount: int = 1) -> Op:
    return (INCR, key.encode(), amount)


def put(key: str, value: bytes) -> Op:
    return (PUT, key.encode(), value)
