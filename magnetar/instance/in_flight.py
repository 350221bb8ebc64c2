"""Which message an instance process has in user code, and since when, kept where it survives
the process.

A function that kills its own process (``os._exit``, a segfault in an extension, the memory
limit) cannot report which message did it. So the instance writes the message it hands to user
code into a small file mapped in memory (a store into the page cache: no system call per
message), and clears it when user code returns. The worker reads the file: after an unasked-for
exit, a message still recorded is the one that killed the process (its failure, see
``FailureHandler.crashed``), and while the process runs, the record's age says how long user code
has been busy with one message.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import Any

import pulsar

from magnetar.instance.dead_letter import origin_message_id

__all__ = ["InFlight", "InFlightRecord", "message_key", "read_in_flight"]

_SIZE = 4096
_HEADER = struct.Struct("<dHH")
"""When the message entered user code (wall clock; 0.0: none is in user code), then the lengths
of its topic's name and of its serialized message id, which follow."""
_ENTERED = struct.Struct("<d")
_MAX_TOPIC = 2048


def message_key(topic: str, message_id: Any) -> str:
    """How a message is named across restarts: its topic and its id as Pulsar prints it."""
    return f"{topic} {origin_message_id(message_id)}"


@dataclass(frozen=True)
class InFlight:
    """The message an instance had in user code (``message_key``), and since when."""

    key: str
    entered_at: float
    """``time.time()`` when user code was handed the message."""

    @property
    def description(self) -> str:
        """``message <id> from <topic>``."""
        topic, _, message_id = self.key.rpartition(" ")
        return f"message {message_id} from {topic}"


class InFlightRecord:
    """The writing side, in the instance process; without a path it records nothing."""

    def __init__(self, path: str | None = None) -> None:
        self._map: mmap.mmap | None = None
        self._topic: str | None = None
        self._id_at = _HEADER.size
        if path is not None:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.ftruncate(descriptor, _SIZE)
                self._map = mmap.mmap(descriptor, _SIZE)
            finally:
                os.close(descriptor)

    def enter(self, topic: str, message_id: Any) -> None:
        """User code is handed this message now."""
        record = self._map
        if record is None:
            return
        if topic is not self._topic:  # the name is written once per topic change
            self._topic = topic
            name = topic.encode()[:_MAX_TOPIC]
            record[_HEADER.size : _HEADER.size + len(name)] = name
            self._id_at = _HEADER.size + len(name)
        # one call of the client's (the id's fields cost a call each), and one store
        serialized = message_id.serialize()
        at = self._id_at
        record[at : at + len(serialized)] = serialized
        _HEADER.pack_into(record, 0, time.time(), at - _HEADER.size, len(serialized))

    def leave(self) -> None:
        """User code is done with the message."""
        if self._map is not None:
            _ENTERED.pack_into(self._map, 0, 0.0)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


def read_in_flight(path: str) -> InFlight | None:
    """The message recorded in ``path`` as in user code; None when none is (or no file)."""
    try:
        with open(path, "rb") as file:
            data = file.read(_SIZE)
    except OSError:
        return None
    if len(data) < _HEADER.size:
        return None
    entered_at, topic_length, id_length = _HEADER.unpack_from(data)
    if not entered_at:
        return None
    topic = data[_HEADER.size : _HEADER.size + topic_length].decode(errors="replace")
    at = _HEADER.size + topic_length
    try:
        message_id = pulsar.MessageId.deserialize(data[at : at + id_length])
    except Exception:  # written while the process died: the message cannot be named
        return None
    return InFlight(message_key(topic, message_id), entered_at)
