"""A message's place in its topic partition: what replays and redelivery filters compare.

Brokers (pulsar-lite in particular) may deliver a message again, but never deliver a new
message out of order within a topic partition, so anything replaying a topic skips a message
whose position is not after the last one it applied. Consumers of a subscription are another
matter (see ``AppliedPositions``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from magnetar.broker_probe import protobuf_fields

__all__ = ["NOTHING", "AppliedPositions", "Position", "batch_size", "more_in_batch", "position"]

Position = tuple[int, int, int]
"""(ledger id, entry id, batch index): comparable and hashable within one partition."""


def position(message_id: Any) -> Position:
    """A message's place in its topic partition."""
    return (message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())


NOTHING: Position = (-1, -1, -1)
"""Before the first message of a partition."""


def batch_size(serialized_id: bytes) -> int:
    """The ``batch_size`` (field 6) of a serialized ``MessageIdData``; 0 when absent.

    The Python client exposes a message's batch index but not its batch's size, which tells
    whether a message ends its entry.
    """
    for number, value in protobuf_fields(serialized_id):
        if number == 6 and isinstance(value, int):
            return value
    return 0


def more_in_batch(message_id: Any) -> bool:
    """Whether more messages of ``message_id``'s batch follow it (False when unknown)."""
    index: int = message_id.batch_index()
    return index >= 0 and batch_size(message_id.serialize()) > index + 1


class AppliedPositions:
    """The positions applied from one topic partition: each of the last ``window`` (the
    highest ones), and a floor at or below which everything counts as applied.

    Not only the highest: when the active consumer of a Failover subscription changes,
    pulsar-lite may hand the new consumer fresh messages before the ones the old consumer
    left unacknowledged, so an older position is not necessarily a repeat.
    """

    def __init__(
        self, window: int = 100_000, floor: Position = NOTHING, recent: Iterable[Position] = ()
    ) -> None:
        self.window = window
        self.floor = floor
        self._recent = set(recent)
        self._heap = list(self._recent)
        heapq.heapify(self._heap)

    def __contains__(self, current: Position) -> bool:
        return current <= self.floor or current in self._recent

    def add(self, current: Position) -> Position | None:
        """Note ``current`` as applied; returns the position that left the window (the new
        floor), if one did."""
        self._recent.add(current)
        heapq.heappush(self._heap, current)
        if len(self._heap) <= self.window:
            return None
        oldest = heapq.heappop(self._heap)
        self._recent.discard(oldest)
        self.floor = max(self.floor, oldest)
        return oldest
