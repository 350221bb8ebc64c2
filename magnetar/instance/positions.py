"""Message positions: skipping redeliveries (EFFECTIVELY_ONCE) and deriving sequence ids.

Brokers (pulsar-lite in particular) may deliver a message again, but never deliver a new
message out of order within a topic partition. So a message whose position is not after the
last one applied on its partition was applied before, unless it is being retried after a
failure.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Position", "RedeliveryFilter", "position", "sequence_id"]

Position = tuple[int, int, int]
"""(ledger id, entry id, batch index): comparable and hashable within one partition."""


def position(message_id: Any) -> Position:
    """A message's place in its topic partition."""
    return (message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())


def sequence_id(message_id: Any) -> int:
    """A producer sequence id that grows with the input's position, so a broker with
    deduplication drops the output of a replayed input."""
    return int(
        (message_id.ledger_id() << 40)
        | (message_id.entry_id() << 12)
        | ((message_id.batch_index() + 1) & 0xFFF)
    )


class RedeliveryFilter:
    """Tells a first delivery from a redelivery of something already applied."""

    def __init__(self) -> None:
        self._last_applied: dict[str, Position] = {}
        self._retrying: set[Position] = set()

    def is_redelivery(self, topic: str, message_id: Any) -> bool:
        """True when the message was applied already; otherwise it counts as applied now."""
        current = position(message_id)
        last = self._last_applied.get(topic)
        if last is not None and current <= last:
            if current in self._retrying:
                self._retrying.discard(current)
                return False
            return True
        self._last_applied[topic] = current
        return False

    def retry(self, message_id: Any) -> None:
        """The message failed: let its next delivery through."""
        self._retrying.add(position(message_id))
