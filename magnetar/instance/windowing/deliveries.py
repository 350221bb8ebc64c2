"""What a delivered message is to the windows: a new input, an input already in the windows
(delivered again: after a restart, a rewind, or one of pulsar-lite's duplicates), or one the
windows are done with.

Positions decide, per topic partition. An input in the windows is known by its position
(after a restart, from the checkpoint, until it is delivered again); a message delivered
again while its first delivery is still being handled is dropped (it is acknowledged through
the first); a message the last checkpoint lists as done is acknowledged again and skipped;
anything else is new. Positions are never compared by order, so inputs redistributed by a
Shared subscription, or handed over on a Failover take-over, are windowed, not lost.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any

from magnetar.instance.windowing.checkpoint import Buffered, DoneRuns
from magnetar.instance.windowing.engine import Event
from magnetar.positions import Position

__all__ = ["Deliveries", "Delivery", "Input"]

_SEEN = 200_000
"""Positions remembered as handled in this run, to drop duplicates."""

Key = tuple[str, Position]


@dataclass(eq=False, slots=True)
class Input:
    """An input in the windows: the delivery to acknowledge it through, and its value."""

    topic: str
    position: Position
    consumer: Any = None
    message: Any = None
    """None until an input restored from a checkpoint is delivered again."""
    value: Any = None
    dead_lettered: bool = False
    """Sent to the dead-letter topic by a window that failed (once is enough)."""


class Delivery(Enum):
    """What a delivered message is (see the module docstring)."""

    NEW = "new"
    RESTORED = "restored"
    """An input restored from the checkpoint, delivered again: its value is still to read."""
    DUPLICATE = "duplicate"
    DONE = "done"


class Deliveries:
    """The inputs in the windows by position, and the positions handled in this run."""

    def __init__(self, done: DoneRuns | None = None) -> None:
        self.buffered: dict[Key, Event] = {}
        self.done = done or DoneRuns()
        self.unmatched = 0
        """Restored inputs not delivered again yet."""
        self._seen: set[Key] = set()
        self._seen_order: deque[Key] = deque()

    def restore(self, buffered: list[Buffered]) -> list[tuple[Event, bool]]:
        """The checkpoint's inputs as events waiting for their messages."""
        events = []
        for entry in buffered:
            event = Event(entry.timestamp, Input(entry.topic, entry.position))
            self.buffered[(entry.topic, entry.position)] = event
            events.append((event, entry.in_last_window))
        self.unmatched = len(events)
        return events

    def classify(self, topic: str, position: Position, consumer: Any, message: Any) -> Delivery:
        key = (topic, position)
        event = self.buffered.get(key)
        if event is not None:
            item: Input = event.item
            restored = item.message is None
            # acknowledged through the latest delivery (a rewind closes the earlier consumer)
            item.consumer, item.message = consumer, message
            if restored:
                self.unmatched -= 1
                self._note(key)
                return Delivery.RESTORED
            return Delivery.DUPLICATE
        if key in self._seen:
            return Delivery.DUPLICATE
        self._note(key)
        if key in self.done:
            return Delivery.DONE
        return Delivery.NEW

    def add(self, event: Event) -> None:
        item: Input = event.item
        self.buffered[(item.topic, item.position)] = event

    def expired(self, event: Event, now_ms: int) -> None:
        """``event`` left the windows: its input is acknowledged with the next checkpoint."""
        item: Input = event.item
        del self.buffered[(item.topic, item.position)]
        self.done.add(item.topic, item.position, now_ms)

    def finished(self, topic: str, position: Position, now_ms: int) -> None:
        """A message handled without the windows (late, dead-lettered)."""
        self.done.add(topic, position, now_ms)

    def forget(self, topic: str, position: Position) -> None:
        """The message will be delivered again (a retry): let it through then."""
        self._seen.discard((topic, position))

    def release(self, event: Event) -> None:
        """A restored input that was not delivered again: it went elsewhere, and is new if
        it comes back."""
        item: Input = event.item
        del self.buffered[(item.topic, item.position)]
        self.unmatched -= 1

    def _note(self, key: Key) -> None:
        self._seen.add(key)
        order = self._seen_order
        order.append(key)
        if len(order) > _SEEN:
            self._seen.discard(order.popleft())
