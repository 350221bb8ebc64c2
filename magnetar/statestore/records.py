"""The state journal's binary format, the limits on state, and the rules of one update.

A journal *message* is what one writer sends at once: a header (format version, writer id,
the writer's epoch, flags) and one or more *records*. A record is the state updates of one
input message: the writer's sequence number, the input's topic and position (empty for
updates that come from no input, such as REST puts), and its operations. An instance packs
the records of the inputs it processed together into one message, so a record is applied
whole or not at all and costs the broker nothing per input.

Operations: ``INCR`` adds a signed 64-bit amount to a counter (wrapping like Java's long, as
BookKeeper's counters do), ``PUT`` replaces a key's value, ``DELETE`` removes a key,
``CLEAR`` removes every key (a deleted function's state). ``EXPECT`` guards the rest of its
record: the operations after it apply only if the key holds exactly the given value then
(a timer's firing applies only while the timer is still pending, see ``timer_once``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from magnetar.statestore.exceptions import InvalidStateUpdateError, StateTooLargeError

__all__ = [
    "CLEAR",
    "DELETE",
    "EXPECT",
    "INCR",
    "INT64",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_KEY_BYTES",
    "MAX_RECORD_BYTES",
    "MAX_VALUE_BYTES",
    "OP_HEADER",
    "PUT",
    "RECORD_HEADER",
    "SOURCE",
    "U32",
    "Entry",
    "JournalMessage",
    "Op",
    "Record",
    "StateEntry",
    "apply_op",
    "decode_message",
    "decode_records",
    "encode_message",
    "encode_record",
    "holds",
    "state_key",
]

INCR, PUT, DELETE, CLEAR, EXPECT = 1, 2, 3, 4, 5

MAX_KEY_BYTES = 4096
"""Longest key, in UTF-8 bytes."""
MAX_VALUE_BYTES = 1024 * 1024
"""Largest value one ``put_state`` stores (1 MiB)."""
MAX_RECORD_BYTES = 4 * 1024 * 1024
"""Most bytes the state updates of one input message may take together (4 MiB): one record
must fit in one broker message (5 MB by default)."""

_FORMAT = 1
_DEDUP = 0x01

_HEADER = struct.Struct(">BQqB")  # format, writer id, epoch, flags
RECORD_HEADER = struct.Struct(">QHI")
"""A record's header: sequence number, source topic length, number of operations."""
SOURCE = struct.Struct(">qqi")
"""A record's input position: ledger, entry, batch index."""
OP_HEADER = struct.Struct(">BH")
"""An operation's header: kind, key length (then the key, then its argument)."""
INT64 = struct.Struct(">q")
U32 = struct.Struct(">I")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

Op = tuple[int, bytes, Any]
"""(kind, key, amount for INCR / value for PUT and EXPECT / None)."""

Entry = tuple[bool, Any, int]
"""A key's state in a table: (is counter, int or bytes, version)."""

Position = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class StateEntry:
    """A key's state as queries return it (Apache Pulsar's FunctionState, less the key)."""

    counter: int | None
    """The counter's value, when the key holds a counter."""
    value: bytes | None
    """The value, when the key holds one (``put_state``)."""
    version: int
    """How many times the key was updated since it was created, from 0."""

    @classmethod
    def of(cls, entry: Entry) -> StateEntry:
        is_counter, data, version = entry
        return cls(data, None, version) if is_counter else cls(None, data, version)


@dataclass(frozen=True, slots=True)
class Record:
    """The state updates of one input message."""

    seq: int
    source_topic: str
    """The input's topic partition; empty when the updates come from no input."""
    source: Position
    ops: list[Op]


@dataclass(frozen=True, slots=True)
class JournalMessage:
    """One message of a state journal."""

    writer_id: int
    """Random id of the writing process, so a writer recognizes its own records."""
    epoch: int
    """The writer's function version; a CLEAR drops later records of older epochs."""
    dedup: bool
    """Records apply once per input position (EFFECTIVELY_ONCE)."""
    records: list[Record]


def state_key(key: Any) -> bytes:
    """The UTF-8 key, checked: a non-empty str of at most ``MAX_KEY_BYTES`` bytes."""
    if not isinstance(key, str):
        raise InvalidStateUpdateError(f"a state key must be a str, got {type(key).__name__}")
    raw = key.encode()
    if not raw or len(raw) > MAX_KEY_BYTES:
        raise InvalidStateUpdateError(
            f"state key {key[:40]!r}{'...' if len(key) > 40 else ''} is {len(raw)} bytes: keys "
            f"must be 1 to {MAX_KEY_BYTES} bytes of UTF-8"
        )
    return raw


def check_amount(key: str, amount: Any) -> int:
    """``amount`` if it is an int that fits a signed 64-bit counter."""
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise InvalidStateUpdateError(
            f"the amount to add to counter {key!r} must be an integer, got "
            f"{type(amount).__name__} {amount!r}"
        )
    if not INT64_MIN <= amount <= INT64_MAX:
        raise InvalidStateUpdateError(
            f"the amount {amount} to add to counter {key!r} does not fit a signed 64-bit integer"
        )
    return amount


def check_value(key: str, value: bytes) -> bytes:
    """``value`` if it is within ``MAX_VALUE_BYTES``."""
    if len(value) > MAX_VALUE_BYTES:
        raise StateTooLargeError(
            f"the value of state key {key!r} is {len(value):,} bytes, more than the limit of "
            f"{MAX_VALUE_BYTES:,} bytes (1 MiB)"
        )
    return value


def encode_record(seq: int, source_topic: bytes, source: Position, ops: list[Op]) -> bytes:
    """One record (its ops already checked)."""
    parts = [RECORD_HEADER.pack(seq, len(source_topic), len(ops))]
    if source_topic:
        parts.append(source_topic)
        parts.append(SOURCE.pack(*source))
    for kind, key, arg in ops:
        parts.append(OP_HEADER.pack(kind, len(key)))
        parts.append(key)
        if kind == INCR:
            parts.append(INT64.pack(arg))
        elif kind in (PUT, EXPECT):
            parts.append(U32.pack(len(arg)))
            parts.append(arg)
    return b"".join(parts)


def encode_message(writer_id: int, epoch: int, dedup: bool, records: list[bytes]) -> bytes:
    """A journal message of encoded records."""
    return _HEADER.pack(_FORMAT, writer_id, epoch, _DEDUP if dedup else 0) + b"".join(records)


def decode_records(records: list[bytes]) -> list[Record]:
    """Parse encoded records (of this process, to index them once it starts reading)."""
    return decode_message(encode_message(0, 0, False, records)).records


def decode_message(payload: bytes) -> JournalMessage:
    """Parse a journal message; ValueError when it is not one."""
    try:
        version, writer_id, epoch, flags = _HEADER.unpack_from(payload, 0)
        if version != _FORMAT:
            raise ValueError(f"unknown journal format {version}")
        offset = _HEADER.size
        records: list[Record] = []
        end = len(payload)
        while offset < end:
            seq, topic_length, count = RECORD_HEADER.unpack_from(payload, offset)
            offset += RECORD_HEADER.size
            source_topic = ""
            source: Position = (-1, -1, -1)
            if topic_length:
                source_topic = payload[offset : offset + topic_length].decode()
                offset += topic_length
                source = SOURCE.unpack_from(payload, offset)
                offset += SOURCE.size
            ops: list[Op] = []
            for _ in range(count):
                kind, key_length = OP_HEADER.unpack_from(payload, offset)
                offset += OP_HEADER.size
                key = payload[offset : offset + key_length]
                offset += key_length
                arg: Any = None
                if kind == INCR:
                    (arg,) = INT64.unpack_from(payload, offset)
                    offset += 8
                elif kind in (PUT, EXPECT):
                    (length,) = U32.unpack_from(payload, offset)
                    offset += 4
                    arg = payload[offset : offset + length]
                    offset += length
                elif kind not in (DELETE, CLEAR):
                    raise ValueError(f"unknown operation {kind}")
                ops.append((kind, key, arg))
            records.append(Record(seq, source_topic, source, ops))
        if offset != end:
            raise ValueError("truncated record")
    except (struct.error, UnicodeDecodeError) as error:
        raise ValueError(f"malformed journal message: {error}") from None
    return JournalMessage(writer_id, epoch, bool(flags & _DEDUP), records)


def holds(entry: Entry | None, value: bytes) -> bool:
    """Whether an entry holds exactly ``value`` (an ``EXPECT``'s condition)."""
    return entry is not None and not entry[0] and bytes(entry[1]) == value


def apply_op(entry: Entry | None, kind: int, arg: Any) -> Entry | None:
    """A key's entry after one operation (CLEAR and EXPECT are the table's business)."""
    if kind == INCR:
        if entry is not None and entry[0]:
            total = entry[1] + arg
            if not INT64_MIN <= total <= INT64_MAX:  # wrap like a Java long
                total = (total - INT64_MIN) % 2**64 + INT64_MIN
            return (True, total, entry[2] + 1)
        # a missing key starts at 0; a key holding a value becomes a counter
        return (True, arg, 0 if entry is None else entry[2] + 1)
    if kind == PUT:
        return (False, arg, 0 if entry is None else entry[2] + 1)
    if kind == EXPECT:
        return entry
    return None
