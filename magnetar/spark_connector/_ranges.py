"""Reading one range ``(start, end]`` of one topic partition, exactly.

Every range gets a reader of its own, started at the entry that holds ``start``: seeking an
open reader is unreliable on pulsar-lite (stale prefetched messages, dropped connections).
Readers there also redeliver messages they already returned, but never return a message for
the first time out of order, so the rule that makes a range exact is: skip every message
whose position is not greater than the last one yielded.

This loop runs once per message: it calls the client's extension objects directly (the
``pulsar`` package wraps each message and id in Python objects of its own), and messages
come out as they are, for :mod:`._schema` to turn into columns.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import pulsar
from pyspark.sql.datasource import InputPartition

from magnetar.spark_connector._client import last_position
from magnetar.spark_connector._offsets import (
    ENTRY_END,
    Position,
    batch_size,
    reader_start,
)
from magnetar.spark_connector._passthrough import reader_kwargs
from magnetar.spark_connector._topic_schema import NO_SCHEMA, TopicSchema
from magnetar.spark_connector.exceptions import PulsarReadError

__all__ = ["Chunk", "RangePartition", "ReadSettings", "read_range", "resolved_end"]

log = logging.getLogger(__name__)

_STALL_MS = 1000
"""A reader silent this long while messages are known to follow is replaced."""


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


Chunk = list[tuple[Any, Any]]
"""``(message, message_id)`` pairs, in order."""


def read_range(
    client: pulsar.Client, part: RangePartition, settings: ReadSettings, chunk_rows: int = 8192
) -> Generator[Chunk, None, None]:
    """The messages of ``part`` in order, once each, filtered by publish time if asked (the
    client's raw message and id objects), in chunks of up to ``chunk_rows``: handing over a
    chunk rather than each message keeps the per-message loop tight.

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
    end_entry = end[:2]
    stall_ms = min(settings.poll_timeout_ms, _STALL_MS)
    waited_ms = 0
    last = part.start
    chunk: Chunk = []
    add = chunk.append
    reader = _open_reader(client, part.topic, last, settings)
    read_next = _raw(reader).read_next
    try:
        while last < end:
            try:
                message = read_next(stall_ms)
            except pulsar.Timeout:
                waited_ms += stall_ms
                if waited_ms >= settings.poll_timeout_ms:
                    _lost(part, end, last, settings)
                    break
                # pulsar-lite drops a reader's connection now and then (it fails on some
                # acknowledgements of batched messages), and a reader that reconnects inside
                # a batch may never be sent the rest: go on with a fresh one.
                reader.close()
                reader = _open_reader(client, part.topic, last, settings)
                read_next = _raw(reader).read_next
                continue
            message_id = message.message_id()
            position = (message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())
            if position > end:
                break
            if position > last:  # else a redelivery, which is no progress
                last = position
                waited_ms = 0
                if not timed or since <= message.publish_timestamp() < until:
                    add((message, message_id))
                    if len(chunk) >= chunk_rows:
                        yield chunk
                        chunk = []
                        add = chunk.append
            if open_end and position[:2] == end_entry and _closes_entry(message_id, reader):
                break
        if chunk:
            yield chunk
    finally:
        reader.close()


def _raw(reader: Any) -> Any:
    """The extension object behind a ``pulsar.Reader`` (its ``read_next`` skips a Python
    wrapper per message), or the reader itself on a client that has none."""
    return getattr(reader, "_reader", reader)


def _open_reader(client: pulsar.Client, topic: str, after: Position, settings: ReadSettings) -> Any:
    start_id, inclusive = reader_start(after)
    kwargs: dict[str, Any] = {"receiver_queue_size": 1000, **reader_kwargs(settings.reader_conf)}
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


def _closes_entry(message_id: Any, reader: Any) -> bool:
    """Whether no message follows ``message_id`` in its entry."""
    index = message_id.batch_index()
    if index < 0:
        return True  # not batched: one message per entry
    size = batch_size(message_id.serialize())
    if size:
        return bool(index == size - 1)
    return not reader.has_message_available()


def _lost(part: RangePartition, end: Position, last: Position, settings: ReadSettings) -> None:
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
