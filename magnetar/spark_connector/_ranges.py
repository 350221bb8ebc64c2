"""Reading one range ``(start, end]`` of one topic partition, exactly.

Every range gets a reader of its own, started at the entry that holds ``start``: seeking an
open reader is unreliable on pulsar-lite (stale prefetched messages, dropped connections).
Readers there also redeliver messages they already returned, but never return a message for
the first time out of order, so the rule that makes a range exact is: skip every message
whose position is not greater than the last one yielded.

This loop runs once per message: it calls the client's extension objects directly (the
``pulsar`` package wraps each message and id in Python objects of its own), as few times as
it can, and messages come out as they are, for :mod:`._schema` to turn into columns.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import pulsar
from pyspark.sql.datasource import InputPartition

from magnetar.positions import batch_size
from magnetar.spark_connector._client import last_position
from magnetar.spark_connector._offsets import (
    ENTRY_END,
    Position,
    position_of,
    reader_start,
)
from magnetar.spark_connector._passthrough import reader_kwargs
from magnetar.spark_connector._topic_schema import NO_SCHEMA, TopicSchema
from magnetar.spark_connector.exceptions import PulsarReadError

__all__ = [
    "Chunk",
    "RangePartition",
    "ReadPath",
    "ReadSettings",
    "lost",
    "read_range",
    "resolved_end",
]

log = logging.getLogger(__name__)

ReadPath = Literal["auto", "native", "python"]
"""How executors read: natively where the native reader can (auto), or only one way."""

_STALL_MS = 1000
"""A reader silent this long while messages are known to follow is replaced."""

_RECEIVER_QUEUE = 10_000
"""Messages a reader prefetches unless ``receiverQueueSize`` says otherwise. With the client's
default of 1000, pulsar-lite redelivered whole entries at refills (up to three deliveries a
message), and each message cost more; a chunk of rows holds about as many messages anyway."""


@dataclass(frozen=True)
class ReadSettings:
    """How executors read: what they need of the options, picklable."""

    service_url: str
    client_conf: dict[str, str] = field(default_factory=dict)
    reader_conf: dict[str, str] = field(default_factory=dict)
    """``pulsar.reader.*``, by Java names."""
    poll_timeout_ms: int = 120_000
    fail_on_data_loss: bool = False
    subscription_prefix: str | None = None
    """Prefix of the readers' subscription names (``subscriptionPrefix``)."""
    schema: TopicSchema = NO_SCHEMA
    """How values are decoded."""
    read_path: ReadPath = "auto"
    """``magnetar.readPath``: the native reader where it can read (auto), or one path."""


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Spark task's share: the messages of ``topic`` in ``(start, end]``."""

    topic: str
    """Full name of one topic partition."""
    start: Position
    """Position of the last message before the range (exclusive)."""
    end: Position | None
    """Position of the last message of the range (inclusive); None: the last message there
    when the task runs (a batch read's "latest", so each evaluation sees what is new)."""
    starting_time: int | None = None
    """Keep messages published at or after this time (ms)."""
    ending_time: int | None = None
    """Keep messages published before this time (ms)."""


def resolved_end(client: pulsar.Client, part: RangePartition) -> Position:
    """The end of ``part``, looked up now if it is "latest"."""
    return last_position(client, part.topic) if part.end is None else part.end


_VARINTS = [bytes((i,)) for i in range(0x80)] + [
    bytes((i & 0x7F | 0x80, i >> 7)) for i in range(0x80, 0x4000)
]
"""Batch indexes as protobuf varints, up to two bytes (batches of up to 16384 messages)."""
_BATCH_INDEX_TAG = b"\x20"
"""Field 4 (``batch_index``) of ``MessageIdData``, a varint."""


class Chunk(NamedTuple):
    """Messages in order (the client's raw objects) and their serialized ids, as two lists:
    a column is then one method mapped over the messages, or the ids as they are."""

    messages: list[Any]
    ids: list[bytes]


def read_range(
    client: pulsar.Client, part: RangePartition, settings: ReadSettings, chunk_rows: int = 8192
) -> Generator[Chunk, None, None]:
    """The messages of ``part`` in order, once each, filtered by publish time if asked (the
    client's raw messages, with their serialized ids), in chunks of up to ``chunk_rows``:
    handing over a chunk rather than each message keeps the per-message loop tight.

    When the range cannot be read to its end (the broker has fewer messages, or sends
    nothing for ``pollTimeoutMs``) this raises :class:`PulsarReadError` if
    ``failOnDataLoss`` is true, and otherwise logs a warning and ends the range early.
    """
    end = resolved_end(client, part)
    if end <= part.start:
        return
    timed = part.starting_time is not None or part.ending_time is not None
    since = part.starting_time or 0
    until = math.inf if part.ending_time is None else part.ending_time
    # An end of ENTRY_END covers an entry whose message count is unknown until the reader
    # meets the message that closes it.
    open_end = end[2] == ENTRY_END
    last_entry = (*end[:2], -1)  # positions from here on are in the end's entry
    stall_ms = min(settings.poll_timeout_ms, _STALL_MS)
    waited_ms = 0
    last = part.start
    messages: list[Any] = []
    ids: list[bytes] = []
    # The position of the message before and its serialized id split around the batch index
    # (see _around_batch_index); an empty head predicts nothing.
    ledger = entry = batch = -1
    head = tail = b""
    reader = _open_reader(client, part.topic, last, settings)
    read_next = _raw(reader).read_next
    try:
        while last < end:
            try:
                message = read_next(stall_ms)
            except pulsar.Timeout:
                waited_ms += stall_ms
                if waited_ms >= settings.poll_timeout_ms:
                    lost(part, end, last, settings)
                    break
                # pulsar-lite drops a reader's connection now and then (it fails on some
                # acknowledgements of batched messages), and a reader that reconnects inside
                # a batch may never be sent the rest: go on with a fresh one.
                reader.close()
                reader = _open_reader(client, part.topic, last, settings)
                read_next = _raw(reader).read_next
                continue
            message_id = message.message_id()
            serialized = message_id.serialize()
            # Most messages follow the one before in its batch: the id that one predicts is
            # compared as bytes, which is cheaper than asking the id for its position.
            batch += 1
            if batch < len(_VARINTS) and serialized == head + _VARINTS[batch] + tail:
                position = (ledger, entry, batch)
            else:
                position = position_of(message_id)
                ledger, entry, batch = position
                head, tail = _around_batch_index(position, message_id.partition(), serialized)
            if position > end:
                break
            if position > last:  # else a redelivery, which is no progress
                last = position
                waited_ms = 0
                if not timed or since <= message.publish_timestamp() < until:
                    messages.append(message)
                    ids.append(serialized)
                    if len(messages) >= chunk_rows:
                        yield Chunk(messages, ids)
                        messages, ids = [], []
            if open_end and position >= last_entry and _closes_entry(batch, serialized, reader):
                break
        if messages:
            yield Chunk(messages, ids)
    finally:
        reader.close()


def _around_batch_index(
    position: Position, partition: int, serialized: bytes
) -> tuple[bytes, bytes]:
    """``serialized`` (the id at ``position``) without its batch index: what comes before and
    after, so that ``head + _VARINTS[i] + tail`` is the id of message ``i`` of the same batch;
    empty if the id is not laid out so (``MessageIdData`` fields in order, as the client
    writes them), and then no id is predicted."""
    ledger, entry, index = position
    if not 0 <= index < len(_VARINTS):
        return b"", b""
    head = pulsar.MessageId(partition, ledger, entry, -1).serialize() + _BATCH_INDEX_TAG
    if not serialized.startswith(head + _VARINTS[index]):
        return b"", b""
    return head, serialized[len(head) + len(_VARINTS[index]) :]


def _raw(reader: Any) -> Any:
    """The extension object behind a ``pulsar.Reader`` (its ``read_next`` skips a Python
    wrapper per message), or the reader itself on a client that has none."""
    return getattr(reader, "_reader", reader)


def _open_reader(client: pulsar.Client, topic: str, after: Position, settings: ReadSettings) -> Any:
    start_id, inclusive = reader_start(after)
    kwargs: dict[str, Any] = {
        "receiver_queue_size": _RECEIVER_QUEUE,
        **reader_kwargs(settings.reader_conf),
    }
    prefix = (
        settings.subscription_prefix
        or settings.reader_conf.get("subscriptionRolePrefix")
        or settings.reader_conf.get("subscriptionName")
        or "magnetar-spark"
    )
    try:
        return client.create_reader(
            topic,
            start_id,
            start_message_id_inclusive=inclusive,
            # The client names a reader's subscription with a random generator that forked
            # Python workers share, and pulsar-lite resumes a known name where it stopped.
            subscription_role_prefix=f"{prefix}-{uuid.uuid4().hex}",
            **kwargs,
        )
    except pulsar.PulsarException as error:
        raise PulsarReadError(f"cannot open a reader on {topic}: {error}") from None


def _closes_entry(index: int, serialized_id: bytes, reader: Any) -> bool:
    """Whether no message follows the one at batch ``index`` with ``serialized_id`` in its
    entry."""
    if index < 0:
        return True  # not batched: one message per entry
    size = batch_size(serialized_id)
    if size:
        return bool(index == size - 1)
    return not reader.has_message_available()


def lost(part: RangePartition, end: Position, last: Position, settings: ReadSettings) -> None:
    """A range that cannot be read to its end: an error with ``failOnDataLoss``, else a
    warning (the range ends early)."""
    text = (
        f"{part.topic}: no message after position {last} within pollTimeoutMs="
        f"{settings.poll_timeout_ms}, but the range ends at {_show(end)}; messages may "
        "have been deleted (retention) or the broker is not answering"
    )
    if settings.fail_on_data_loss:
        raise PulsarReadError(text + "; set failOnDataLoss=false to read what is there")
    log.warning("%s; the range ends early (failOnDataLoss=false)", text)


def _show(position: Position) -> str:
    ledger, entry, batch = position
    return f"({ledger}, {entry}, end of entry)" if batch == ENTRY_END else str(position)
