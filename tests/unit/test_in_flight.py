"""The in-flight record, as the worker reads it after the instance wrote it: a queue of the
messages in user code, read as untrusted input."""

from __future__ import annotations

import os
from pathlib import Path

import pulsar

from magnetar.instance.in_flight import InFlightRecord, message_key, read_in_flight

TOPIC = "persistent://public/default/in"


def message_id(entry: int) -> pulsar.MessageId:
    return pulsar.MessageId(-1, 7, entry, -1)


def keys(path: Path) -> list[str]:
    return [found.key for found in read_in_flight(str(path))]


def test_messages_leave_oldest_first_and_the_newest_can_be_withdrawn(tmp_path: Path) -> None:
    path = tmp_path / "in-flight"
    record = InFlightRecord(str(path), capacity=4)
    other = "persistent://public/default/other"
    record.enter(TOPIC, message_id(1))
    record.enter(other, message_id(2))
    record.enter(TOPIC, message_id(3))
    assert keys(path) == [
        message_key(TOPIC, message_id(1)),
        message_key(other, message_id(2)),
        message_key(TOPIC, message_id(3)),
    ]
    record.leave()
    record.leave_newest()
    assert keys(path) == [message_key(other, message_id(2))]
    record.leave()
    assert keys(path) == []
    record.close()


def test_a_queue_that_never_empties_keeps_naming_what_is_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "in-flight"
    record = InFlightRecord(str(path), capacity=3)
    record.enter(TOPIC, message_id(0))
    record.enter(TOPIC, message_id(1))
    for entry in range(2, 500):  # far beyond the space: the live entries move back
        record.enter(TOPIC, message_id(entry))
        record.leave()
        assert keys(path) == [message_key(TOPIC, message_id(n)) for n in (entry - 1, entry)]
    record.clear()
    assert keys(path) == []


def test_the_reader_follows_no_symlink_and_survives_garbage(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(4096))
    link = tmp_path / "in-flight"
    link.symlink_to(secret)
    assert read_in_flight(str(link)) == []
    garbage = tmp_path / "garbage"
    garbage.write_bytes(os.urandom(200_000))
    assert read_in_flight(str(garbage)) == []
    assert read_in_flight(str(tmp_path / "missing")) == []
