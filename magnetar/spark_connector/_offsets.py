"""Message ids as positions, and the offsets JSON Spark checkpoints.

A *position* is ``(ledger, entry, batch_index)``: the place of one message in its topic
partition, ordered as the broker stores them (``batch_index`` is -1 for a message that is
not part of a batch). A range ``(start, end]`` holds every message whose position is greater
than ``start`` and not greater than ``end``; an offset is always the position of the last
message already read.

Two sentinels make the comparisons exact:

* ``BEFORE_EARLIEST`` sorts before every message: the start of a range that has read nothing.
* An end inside ledger ``l``, entry ``e`` with batch index ``ENTRY_END`` covers the whole
  entry, which is what an entry-level id (``batch_index == -1``) means as an end: the broker
  reports the last message of a batched topic that way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pulsar

from magnetar.positions import NOTHING as BEFORE_EARLIEST
from magnetar.positions import Position
from magnetar.positions import position as position_of
from magnetar.spark_connector.exceptions import InvalidOptionError
from magnetar.topics import base_topic, full_topic_name

__all__ = [
    "BEFORE_EARLIEST",
    "ENTRY_END",
    "Position",
    "decode_offset",
    "encode_offset",
    "end_position",
    "inclusive_start_position",
    "parse_offsets_json",
    "parse_times_json",
    "position_of",
    "reader_start",
]

ENTRY_END = 2**31 - 1
"""A batch index after every message of an entry: ``(l, e, ENTRY_END)`` ends at entry e."""


def inclusive_start_position(message_id: Any) -> Position:
    """The exclusive start of a range that includes the message ``message_id`` itself.

    ``(l, e, b - 1)`` sorts right before ``(l, e, b)``; for an entry-level id (``b == -1``)
    it also sorts before every message of a batch stored in that entry.
    """
    ledger, entry, batch = position_of(message_id)
    return (ledger, entry, batch - 1)


def end_position(message_id: Any) -> Position:
    """The inclusive end of a range ending at ``message_id``; an entry-level id covers its
    whole entry, since it may stand for a batch (how the broker reports a last message)."""
    ledger, entry, batch = position_of(message_id)
    return (ledger, entry, ENTRY_END if batch < 0 else batch)


def reader_start(start: Position) -> tuple[Any, bool]:
    """Where a reader for the range after ``start`` begins: ``(message_id, inclusive)``.

    The reader starts at the whole entry holding ``start`` (or at the earliest message);
    the entry's messages up to ``start`` are skipped on the client, as readers redeliver
    them anyway on pulsar-lite.
    """
    if start == BEFORE_EARLIEST:
        return pulsar.MessageId.earliest, True
    ledger, entry, _ = start
    return pulsar.MessageId(-1, ledger, entry, -1), True


def encode_offset(positions: Mapping[str, Position]) -> dict[str, list[int]]:
    """A streaming offset: topic partition -> ``[ledger, entry, batch]``, keys sorted, so an
    unchanged offset serializes to exactly the same JSON."""
    return {topic: list(positions[topic]) for topic in sorted(positions)}


def decode_offset(offset: Mapping[str, Any]) -> dict[str, Position]:
    """The positions in a streaming offset written by :func:`encode_offset`."""
    positions: dict[str, Position] = {}
    for topic, value in offset.items():
        if not (isinstance(value, list) and len(value) == 3):
            raise InvalidOptionError(
                f"offset of {topic} in the checkpoint is {value!r}, not [ledger, entry, batch]: "
                "the checkpoint was not written by the pulsar data source"
            )
        positions[topic] = (int(value[0]), int(value[1]), int(value[2]))
    return positions


def parse_offsets_json(option: str, text: str, topics: Iterable[str] | None) -> dict[str, Any]:
    """``{"<topic>": [signed bytes of MessageId.serialize()]}`` -> topic -> ``MessageId``.

    Names may be short or full, of a topic or of one of its partitions
    (``<topic>-partition-<n>``); each must belong to one of ``topics`` (full names), unless
    ``topics`` is None (a pattern chooses them).
    """
    what = '{"<topic>": [message id bytes]}'
    data = _json_object(option, text, what)
    return {
        topic: _message_id(option, topic, raw)
        for topic, raw in _topic_keys(option, data, topics).items()
    }


def parse_times_json(option: str, text: str, topics: Iterable[str] | None) -> dict[str, int]:
    """``{"<topic>": <publish time ms>}`` -> full topic (partition) name -> ms."""
    data = _json_object(option, text, '{"<topic>": <publish time in ms>}')
    times: dict[str, int] = {}
    for topic, raw in _topic_keys(option, data, topics).items():
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise InvalidOptionError(
                f"{option} for {topic} must be a publish time in milliseconds, got {raw!r}"
            )
        times[topic] = raw
    return times


def _json_object(option: str, text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidOptionError(
            f"{option} is neither 'earliest', 'latest' nor valid JSON ({error.msg} at "
            f"position {error.pos}); expected {what}"
        ) from None
    if not isinstance(data, dict) or not data:
        raise InvalidOptionError(f"{option} JSON must be a non-empty object {what}, got {text!r}")
    return data


def _topic_keys(option: str, data: dict[str, Any], topics: Iterable[str] | None) -> dict[str, Any]:
    known = None if topics is None else set(topics)
    found: dict[str, Any] = {}
    for name, raw in data.items():
        try:
            topic = full_topic_name(name)
        except ValueError as error:
            raise InvalidOptionError(f"{option}: {error}") from None
        if known is not None and base_topic(topic) not in known:
            raise InvalidOptionError(
                f"{option} names {topic}, which is not read; topics read: "
                f"{', '.join(sorted(known))}"
            )
        found[topic] = raw
    return found


def _message_id(option: str, topic: str, raw: Any) -> Any:
    if not (
        isinstance(raw, list)
        and raw
        and all(isinstance(b, int) and not isinstance(b, bool) and -128 <= b <= 255 for b in raw)
    ):
        raise InvalidOptionError(
            f"{option} for {topic} must be the bytes of MessageId.serialize() as a JSON list "
            f"of integers (-128..255), got {raw!r}"
        )
    try:
        return pulsar.MessageId.deserialize(bytes(b & 0xFF for b in raw))
    except Exception as error:
        raise InvalidOptionError(
            f"{option} for {topic} is not a serialized message id: {error}"
        ) from None
