"""Reading one range ``(start, end]`` of one topic partition, exactly.

Every range gets a reader of its own, started at the entry that holds ``start``: seeking an
open reader is unreliable on pulsar-lite (stale prefetched messages, dropped connections).
Readers there also redeliver messages they already returned, but never return a message for
the first time out of order, so the rule that makes a range exact is: skip every message
whose position is not greater than the last one yielded.
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

from magnetar.spark_connector._offsets import (
    ENTRY_END,
    Position,
    batch_size,
    position_of,
    reader_start,
)
from magnetar.spark_connector.exceptions import PulsarReadError

__all__ = ["RangePartition", "ReadSettings", "read_range"]

log = logging.getLogger(__name__)

_STALL_MS = 1000
"""A reader silent this long while messages are known to follow is replaced."""


@dataclass(frozen=True)
class ReadSettings:
    """How executors read: what they need of the options, picklable."""

    service_url: str
    client_conf: dict[str, str] = field(default_factory=dict)
    poll_timeout_ms: int = 120_000
    fail_on_data_loss: bool = True
    starting_time: int | None = None
    """Keep messages published at or after this time (ms)."""
    ending_time: int | None = None
    """Keep messages published before this time (ms)."""
    receiver_queue_size: int = 1000


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Spark task's share: the messages of ``topic`` in ``(start, end]``."""

    topic: str
    """Full name of one topic partition."""
    start: Position
    """Position of the last message before the range (exclusive)."""
    end: Position
    """Position of the last message of the range (inclusive)."""


def read_range(
    client: pulsar.Client, part: RangePartition, settings: ReadSettings
) -> Generator[Any, None, None]:
    """``(message, message_id)`` of each message of ``part`` in order, once, filtered by
    publish time if asked.

    When the range cannot be read to its end (the broker has fewer messages, or sends
    nothing for ``pollTimeoutMs``) this raises :class:`PulsarReadError` if
    ``failOnDataLoss`` is true, and otherwise logs a warning and ends the range early.
    """
    if part.end <= part.start:
        return
    timed = settings.starting_time is not None or settings.ending_time is not None
    since = settings.starting_time or 0
    until = math.inf if settings.ending_time is None else settings.ending_time
    # An end of ENTRY_END covers an entry whose message count is unknown until the reader
    # meets the message that closes it.
    open_end = part.end[2] == ENTRY_END
    stall_ms = min(settings.poll_timeout_ms, _STALL_MS)
    waited_ms = 0
    last = part.start
    reader = _open_reader(client, part.topic, last, settings)
    try:
        while last < part.end:
            try:
                message = reader.read_next(stall_ms)
            except pulsar.Timeout:
                waited_ms += stall_ms
                if waited_ms >= settings.poll_timeout_ms:
                    _lost(part, last, settings)
                    return
                # pulsar-lite drops a reader's connection now and then (it fails on some
                # acknowledgements of batched messages), and a reader that reconnects inside
                # a batch may never be sent the rest: go on with a fresh one.
                reader.close()
                reader = _open_reader(client, part.topic, last, settings)
                continue
            message_id = message.message_id()
            position = position_of(message_id)
            if position > part.end:
                return
            if position > last:  # else a redelivery, which is no progress
                last = position
                waited_ms = 0
                if not timed or since <= message.publish_timestamp() < until:
                    yield message, message_id
            if open_end and position[:2] == part.end[:2] and _closes_entry(message_id, reader):
                return
    finally:
        reader.close()


def _open_reader(client: pulsar.Client, topic: str, after: Position, settings: ReadSettings) -> Any:
    start_id, inclusive = reader_start(after)
    try:
        return client.create_reader(
            topic,
            start_id,
            start_message_id_inclusive=inclusive,
            receiver_queue_size=settings.receiver_queue_size,
            # The client names a reader's subscription with a random generator that forked
            # Python workers share, and pulsar-lite resumes a known name where it stopped.
            subscription_role_prefix=f"magnetar-spark-{uuid.uuid4().hex}",
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


def _lost(part: RangePartition, last: Position, settings: ReadSettings) -> None:
    text = (
        f"{part.topic}: no message after position {last} within pollTimeoutMs="
        f"{settings.poll_timeout_ms}, but the range ends at {_show(part.end)}; messages may "
        "have been deleted (retention) or the broker is not answering"
    )
    if settings.fail_on_data_loss:
        raise PulsarReadError(text + "; set failOnDataLoss=false to read what is there")
    log.warning("%s; the range ends early (failOnDataLoss=false)", text)


def _show(position: Position) -> str:
    ledger, entry, batch = position
    return f"({ledger}, {entry}, end of entry)" if batch == ENTRY_END else str(position)
