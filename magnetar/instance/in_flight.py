"""Which messages an instance process has in user code, and since when, kept where it survives
the process.

A function that kills its own process (``os._exit``, a segfault in an extension, the memory
limit) cannot report which message did it. So the instance records each message it hands to
user code in a small file mapped in memory (stores into the page cache: no system call per
message), and removes it when user code is done with it. A plain function has one message in
user code at a time, an async one up to ``maxPendingAsyncRequests`` and a JavaScript one a
chunk, so the record is a queue: messages enter at its end and leave from its start (results
are handled in input order), or the newest leaves at once (its input could not be decoded).

The worker reads the file. After an unasked-for exit, a message recorded alone is the one that
killed the process (its failure, see ``FailureHandler.crashed``); several recorded are
suspects, which the next process runs one at a time until the one that kills it is alone in
the record. While the process runs, the oldest record's age says how long user code has had it.

The file is written by user code's process, so the worker reads it as untrusted: no symlink
followed, every length bounded.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import pulsar

from magnetar.instance.dead_letter import origin_message_id

__all__ = ["MAX_IN_FLIGHT", "InFlight", "InFlightRecord", "message_key", "read_in_flight"]

MAX_IN_FLIGHT = 10_000
"""The most messages a record holds, so the most an instance hands to user code at once."""

_OFFSETS = struct.Struct("<II")
"""Where the queue's oldest entry starts and where its newest ends."""
_TOPICS = struct.Struct("<II")
"""How many topic names the table holds, and where it ends."""
_NAME = struct.Struct("<H")
_TOPICS_AT = _OFFSETS.size + _TOPICS.size
_ENTRIES_AT = _TOPICS_AT + 64 * 1024
_ENTRY = struct.Struct("<dHH")
"""When the message entered user code (wall clock), its topic's index in the table, the length
of its serialized id, which follows."""
_ENTRY_SIZE = _ENTRY.size
_MAX_ID = 64
_MAX_ENTRY = _ENTRY_SIZE + _MAX_ID
_MAX_SIZE = _ENTRIES_AT + 2 * MAX_IN_FLIGHT * _MAX_ENTRY
_UNRECORDED = -1
_pack_entry = _ENTRY.pack_into
_pack_offsets = _OFFSETS.pack_into
_now = time.time


def message_key(topic: str, message_id: Any) -> str:
    """How a message is named across restarts: its topic and its id as Pulsar prints it."""
    return f"{topic} {origin_message_id(message_id)}"


@dataclass(frozen=True)
class InFlight:
    """A message an instance had in user code (``message_key``), and since when."""

    key: str
    entered_at: float
    """``time.time()`` when user code was handed the message."""

    @property
    def description(self) -> str:
        """``message <id> from <topic>``."""
        topic, _, message_id = self.key.rpartition(" ")
        return f"message {message_id} from {topic}"


class InFlightRecord:
    """The writing side, in the instance process; without a path it records nothing.

    ``capacity``: the most messages user code holds at once (the queue's space is twice that,
    so moving the live entries back to the start is needed at most once per ``capacity``
    entries)."""

    def __init__(self, path: str | None = None, capacity: int = 1) -> None:
        self._map: mmap.mmap | None = None
        self._size = _ENTRIES_AT + 2 * min(max(capacity, 1), MAX_IN_FLIGHT) * _MAX_ENTRY
        self._topics: dict[str, int] = {}
        self._topics_end = _TOPICS_AT
        self._last_topic: str | None = None
        self._last_index = 0
        self._head = self._tail = _ENTRIES_AT
        self._ends: deque[int] = deque()
        """Where each entry in the queue ends, oldest first (``_UNRECORDED``: not written)."""
        if path is not None:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                os.ftruncate(descriptor, self._size)
                self._map = mmap.mmap(descriptor, self._size)
            finally:
                os.close(descriptor)

    def enter(self, topic: str, message_id: Any) -> None:
        """User code is handed this message now."""
        record = self._map
        if record is None:
            return
        if topic is self._last_topic:  # the same str object: no hashing per message
            index: int | None = self._last_index
        else:
            index = self._topic_index(record, topic)
        # one call of the client's (the id's fields cost a call each), and a few stores
        serialized = message_id.serialize()
        at = self._tail
        end = at + _ENTRY_SIZE + len(serialized)
        if end > self._size or index is None or len(serialized) > _MAX_ID:
            self._enter_rarely(record, topic, message_id, index, len(serialized))
            return
        _pack_entry(record, at, _now(), index, len(serialized))
        record[at + _ENTRY_SIZE : end] = serialized
        self._tail = end
        self._ends.append(end)
        _pack_offsets(record, 0, self._head, end)

    def _enter_rarely(
        self, record: mmap.mmap, topic: str, message_id: Any, index: int | None, size: int
    ) -> None:
        """``enter`` where the queue's space is used up or the message cannot be named."""
        if index is not None and size <= _MAX_ID:
            self._compact(record)
            if self._tail + _ENTRY_SIZE + size <= self._size:
                self.enter(topic, message_id)
                return
        self._ends.append(_UNRECORDED)  # more in user code than the capacity, or unnamed

    def leave(self) -> None:
        """User code is done with the oldest message it was handed."""
        ends = self._ends
        if self._map is None or not ends:
            return
        end = ends.popleft()
        if not ends:
            self._head = self._tail = _ENTRIES_AT
            _pack_offsets(self._map, 0, _ENTRIES_AT, _ENTRIES_AT)
        elif end != _UNRECORDED:
            self._head = end
            _pack_offsets(self._map, 0, end, self._tail)

    def leave_newest(self) -> None:
        """The newest message never reached user code after all."""
        if self._map is None or not self._ends:
            return
        self._ends.pop()
        if not self._ends:
            self._empty(self._map)
            return
        self._tail = next((end for end in reversed(self._ends) if end >= 0), self._head)
        _OFFSETS.pack_into(self._map, 0, self._head, self._tail)

    def clear(self) -> None:
        """User code holds no message."""
        if self._map is not None and self._ends:
            self._ends.clear()
            self._empty(self._map)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def _empty(self, record: mmap.mmap) -> None:
        self._head = self._tail = _ENTRIES_AT
        _OFFSETS.pack_into(record, 0, self._head, self._tail)

    def _topic_index(self, record: mmap.mmap, topic: str) -> int | None:
        """The topic's index in the table, added if new; None when the table is full."""
        index = self._topics.get(topic)
        if index is None:
            if not self._ends and len(self._topics) >= 1024:  # no entry refers to the table
                self._topics.clear()
                self._topics_end = _TOPICS_AT
            name = topic.encode()
            end = self._topics_end + _NAME.size + len(name)
            if end > _ENTRIES_AT:
                return None
            _NAME.pack_into(record, self._topics_end, len(name))
            record[self._topics_end + _NAME.size : end] = name
            index = self._topics[topic] = len(self._topics)
            self._topics_end = end
            _TOPICS.pack_into(record, _OFFSETS.size, len(self._topics), end)
        self._last_topic, self._last_index = topic, index
        return index

    def _compact(self, record: mmap.mmap) -> None:
        """Move the live entries back to the start of the queue's space."""
        shift = self._head - _ENTRIES_AT
        if shift <= 0:
            return
        record[_ENTRIES_AT : self._tail - shift] = record[self._head : self._tail]
        self._head, self._tail = _ENTRIES_AT, self._tail - shift
        self._ends = deque(end - shift if end >= 0 else end for end in self._ends)
        _OFFSETS.pack_into(record, 0, self._head, self._tail)


def read_in_flight(path: str) -> list[InFlight]:
    """The messages recorded in ``path`` as in user code, oldest first (none without a file)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return []
        header = os.pread(descriptor, _TOPICS_AT, 0)
        if len(header) < _TOPICS_AT:
            return []
        head, tail = _OFFSETS.unpack_from(header)
        count, topics_end = _TOPICS.unpack_from(header, _OFFSETS.size)
        if not _ENTRIES_AT <= head <= tail <= _MAX_SIZE or topics_end < _TOPICS_AT:
            return []
        table = os.pread(descriptor, min(topics_end, _ENTRIES_AT) - _TOPICS_AT, _TOPICS_AT)
        topics = _topic_names(table, count)
        entries = os.pread(descriptor, tail - head, head)
    except OSError:
        return []
    finally:
        os.close(descriptor)
    return _entries(entries, topics)


def _topic_names(table: bytes, count: int) -> list[str]:
    names: list[str] = []
    at = 0
    while len(names) < count and at + _NAME.size <= len(table):
        (length,) = _NAME.unpack_from(table, at)
        at += _NAME.size
        names.append(table[at : at + length].decode(errors="replace"))
        at += length
    return names


def _entries(data: bytes, topics: list[str]) -> list[InFlight]:
    found: list[InFlight] = []
    at = 0
    while at + _ENTRY.size <= len(data):
        entered_at, index, length = _ENTRY.unpack_from(data, at)
        at += _ENTRY.size
        serialized = data[at : at + length]
        at += length
        if index >= len(topics) or length > _MAX_ID or len(serialized) < length:
            break  # written while the process died: the rest cannot be named
        try:
            message_id = pulsar.MessageId.deserialize(serialized)
        except Exception:
            break
        found.append(InFlight(message_key(topics[index], message_id), entered_at))
    return found
