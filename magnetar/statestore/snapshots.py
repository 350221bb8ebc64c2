"""Snapshots of a state table on the broker, so a new table need not replay the whole journal.

A snapshot is a run of *part* messages (the table's entries and applied input positions,
about 1 MiB each) followed by a *manifest* (JSON: the journal position the snapshot covers
and the first part's message id). The manifest is always the last message written, so the
latest snapshot is found from the topic's last message id and read from its first part:
loading costs the size of one snapshot, not the topic's history. A snapshot whose writer died
before its manifest is simply never found; the previous one (or the journal) is used instead.
"""

from __future__ import annotations

import base64
import json
import logging
import struct
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pulsar

from magnetar.client import open_reader
from magnetar.positions import Position, position
from magnetar.statestore.journal import last_message_id

__all__ = ["Snapshot", "load_latest_snapshot", "publish_snapshot"]

log = logging.getLogger(__name__)

_PART_BYTES = 1024 * 1024
_ITEM = struct.Struct(">HI")
_READ_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class Snapshot:
    """What a snapshot says besides its entries."""

    position_id: bytes
    """The serialized id of the last journal message the snapshot includes."""
    min_epoch: int
    """Records of older epochs are ignored (a deleted function's)."""


def publish_snapshot(
    client: pulsar.Client, topic: str, snapshot: Snapshot, items: Iterable[tuple[bytes, bytes]]
) -> int:
    """Publish ``items`` (the table's database keys and values) as a snapshot; returns the
    number of parts."""
    snapshot_id = uuid.uuid4().hex
    producer = client.create_producer(topic, batching_enabled=False)
    try:
        first: Any = None
        parts = 0
        for payload in _parts(items):
            message_id = producer.send(payload, properties={"snapshot": snapshot_id})
            first = first if first is not None else message_id
            parts += 1
        manifest = {
            "snapshot": snapshot_id,
            "parts": parts,
            "first": base64.b64encode(first.serialize()).decode() if first is not None else None,
            "position": base64.b64encode(snapshot.position_id).decode(),
            "minEpoch": snapshot.min_epoch,
        }
        producer.send(
            json.dumps(manifest).encode(), properties={"snapshot": snapshot_id, "manifest": "1"}
        )
    finally:
        producer.close()
    return parts


def _parts(items: Iterable[tuple[bytes, bytes]]) -> Iterator[bytes]:
    chunk: list[bytes] = []
    size = 0
    for key, entry in items:
        chunk.append(_ITEM.pack(len(key), len(entry)) + key + entry)
        size += _ITEM.size + len(key) + len(entry)
        if size >= _PART_BYTES:
            yield b"".join(chunk)
            chunk, size = [], 0
    if chunk:
        yield b"".join(chunk)


def load_latest_snapshot(
    client: pulsar.Client, topic: str
) -> tuple[Snapshot, Iterator[tuple[bytes, bytes]]] | None:
    """The latest complete snapshot on ``topic`` and an iterator of its entries; None when
    there is none."""
    last = last_message_id(client, topic)
    if last is None:
        return None
    reader = open_reader(client, topic, last, start_message_id_inclusive=True)
    try:
        message = reader.read_next(_READ_TIMEOUT_MS)
    finally:
        reader.close()
    if message.properties().get("manifest") != "1":
        log.warning("the last message of %s is not a snapshot manifest; not using it", topic)
        return None
    manifest = json.loads(message.data())
    snapshot = Snapshot(
        position_id=base64.b64decode(manifest["position"]), min_epoch=int(manifest["minEpoch"])
    )
    first = manifest["first"]
    if first is None:
        return snapshot, iter(())
    first_id = pulsar.MessageId.deserialize(base64.b64decode(first))
    return snapshot, _entries(client, topic, first_id, manifest["snapshot"], manifest["parts"])


def _entries(
    client: pulsar.Client, topic: str, first: Any, snapshot_id: str, parts: int
) -> Iterator[tuple[bytes, bytes]]:
    reader = open_reader(client, topic, first, start_message_id_inclusive=True)
    try:
        seen = 0
        last: Position = (-1, -1, -1)
        while seen < parts:
            message = reader.read_next(_READ_TIMEOUT_MS)
            current = position(message.message_id())
            if current <= last or message.properties().get("snapshot") != snapshot_id:
                continue  # a duplicate delivery, or a part of an abandoned snapshot
            last = current
            seen += 1
            yield from _items(message.data())
    finally:
        reader.close()


def _items(payload: bytes) -> Iterator[tuple[bytes, bytes]]:
    offset = 0
    while offset < len(payload):
        key_length, entry_length = _ITEM.unpack_from(payload, offset)
        offset += _ITEM.size
        key = payload[offset : offset + key_length]
        offset += key_length
        yield key, payload[offset : offset + entry_length]
        offset += entry_length
