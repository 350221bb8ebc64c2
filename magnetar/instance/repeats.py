"""Messages an ordered subscription delivers a second time while the instance still holds the
first: dropped, so user code does not run twice on them.

On a Failover subscription the broker sends a consumer its unacknowledged messages again when
the connection is reset (pulsar-lite also does so now and then without one); the instance is
then still processing, retrying or acknowledging the first copy. A copy is recognised by its
topic and position among the messages received since the instance last subscribed (a rewind
starts afresh, as the broker does). Only the most recent ``window`` are remembered: a copy of
an older one is processed again, as at-least-once allows; a message never seen is never
dropped. A dropped copy is not acknowledged (the first copy's acknowledgement covers it; if
a reset connection lost that, the message comes again once the instance subscribes anew, and
is processed again, as at-least-once allows). Shared subscriptions are left alone: there a
negative acknowledgement asks for a message again on purpose.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any

__all__ = ["RepeatFilter"]


class RepeatFilter:
    """The positions received since the last subscribe, the newest ``window`` of them.
    ``topics``: whether the consumer reads several topics (a position, the serialized message
    id with its partition, is then kept with its topic)."""

    def __init__(self, window: int, topics: bool) -> None:
        self._order: deque[Hashable] = deque()
        self._seen: set[Hashable] = set()
        self._window = window
        self._topics = topics

    def first_time(self, message: Any) -> bool:
        """Whether ``message`` was not received before (it is remembered from now on)."""
        position = message.message_id().serialize()
        key = (message.topic_name(), position) if self._topics else position
        if key in self._seen:
            return False
        if len(self._order) == self._window:
            self._seen.discard(self._order.popleft())
        self._order.append(key)
        self._seen.add(key)
        return True

    def forget(self) -> None:
        """A new subscription: everything unacknowledged comes again, and is new again."""
        self._order.clear()
        self._seen.clear()
