"""Message positions: skipping redeliveries (EFFECTIVELY_ONCE).

A consumer may be handed a message again; a message whose position was applied before (see
``magnetar.positions.AppliedPositions``) is a redelivery, unless it is being retried after a
failure.
"""

from __future__ import annotations

from typing import Any

from magnetar.positions import AppliedPositions, Position, position

__all__ = ["RedeliveryFilter"]


class RedeliveryFilter:
    """Tells a first delivery from a redelivery of something already applied."""

    def __init__(self) -> None:
        self._applied: dict[str, AppliedPositions] = {}
        self._retrying: set[Position] = set()

    def is_redelivery(self, topic: str, message_id: Any) -> bool:
        """True when the message was applied already; otherwise it counts as applied now."""
        current = position(message_id)
        applied = self._applied.get(topic)
        if applied is None:
            applied = self._applied[topic] = AppliedPositions()
        if current in applied:
            if current in self._retrying:
                self._retrying.discard(current)
                return False
            return True
        applied.add(current)
        return False

    def retry(self, message_id: Any) -> None:
        """The message failed: let its next delivery through."""
        self._retrying.add(position(message_id))
