"""What a window function sees of its window: ``context.get_window()``, as the Java SDK's
``Window`` (``get``, ``getNew``, ``getExpired``, start and end timestamps), with every input's
record: its value, message id, topic, key, event time and properties."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Window", "WindowRecord"]


@dataclass(frozen=True)
class WindowRecord:
    """One input of a window."""

    value: Any
    """The input, as the function's ``process`` receives it (deserialized)."""
    message_id: Any
    """The input message's ``pulsar.MessageId``."""
    topic: str
    """The topic (partition) the input came from."""
    key: str | None
    """The input message's key, if any."""
    event_time: int
    """The input message's event time in ms (0 when the producer set none)."""
    publish_time: int
    """When the input was published, in ms."""
    properties: dict[str, str]
    """The input message's properties."""
    timestamp: int
    """The time the window placed the input at, in ms: its event time as the timestamp
    extractor gives it, or (without an extractor) when the instance received it."""


class Window:
    """The inputs of one firing of a window, oldest first."""

    def __init__(
        self,
        records: Callable[[], list[WindowRecord]],
        new: Callable[[], list[WindowRecord]],
        expired: Callable[[], list[WindowRecord]],
        start_timestamp: int | None,
        end_timestamp: int | None,
    ) -> None:
        # records are built on first use: most functions only read the values
        self._records, self._new, self._expired = records, new, expired
        self._start, self._end = start_timestamp, end_timestamp

    def get(self) -> Sequence[WindowRecord]:
        """Every input in the window."""
        return self._records()

    def get_new(self) -> Sequence[WindowRecord]:
        """The inputs that were not in the previous window."""
        return self._new()

    def get_expired(self) -> Sequence[WindowRecord]:
        """The inputs that left the windows since the previous window fired (they are in no
        window any more; after a restart, only what left since the restart)."""
        return self._expired()

    def get_start_timestamp(self) -> int | None:
        """Where a time window starts, in ms (exclusive): its end minus its length; None for
        a count window."""
        return self._start

    def get_end_timestamp(self) -> int | None:
        """When the window fired, in ms (inclusive): the time (or, in event time, the
        watermark-aligned end) the window was computed for."""
        return self._end

    def __repr__(self) -> str:
        return f"Window({len(self.get())} records, {self._start}..{self._end})"
