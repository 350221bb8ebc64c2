"""Retries of failed messages, counted by the instance rather than by the broker.

A broker delivers a message again for reasons that are not failures (a reconnect, a
Failover take-over, pulsar-lite's duplicates), so its redelivery count says nothing about how
often the function failed on a message. The instance counts failures itself: a failed message
stays unacknowledged, held here, and is processed again after a backoff; once it has failed
``maxMessageRetries`` + 1 times it is given up (dead-lettered by the caller). Nothing is
negatively acknowledged, so the messages that share a broker batch with a failing one are
never redelivered with it.

Order is kept as the subscription promises: on an ordered (Failover) subscription nothing
passes a failing message, with ``retainKeyOrdering`` nothing of its key does, and on a Shared
subscription the other messages go on.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from magnetar.positions import Position, position

__all__ = ["Attempt", "Ordering", "RetryQueue"]

_REMEMBERED_FAILURES = 100_000
"""Failure counts kept at most (of messages given to another consumer, say)."""

Received = tuple[Any, Any]
"""A (consumer, message) pair."""


class Ordering(Enum):
    """What must not overtake a failing message."""

    NONE = "none"
    """Shared subscription: the others go on."""
    KEY = "key"
    """Key_Shared with retainKeyOrdering: messages of the same key wait."""
    ALL = "all"
    """Failover subscription: every message waits."""


class Attempt(NamedTuple):
    """What a failure of a message led to."""

    failures: int
    """How many times the function has failed on the message, this time included."""
    retried: bool
    """Whether it will be processed again (else its retries are used up)."""


@dataclass(order=True)
class _Retry:
    due: float
    sequence: int
    key: Any = field(compare=False)
    received: Received = field(compare=False)


class RetryQueue:
    """Failed messages waiting for their next attempt, and what waits behind them."""

    def __init__(
        self,
        ordering: Ordering,
        max_retries: int | None,
        first_delay_s: float,
        max_delay_s: float,
    ) -> None:
        self._ordering = ordering
        self._max_retries = max_retries
        self._first_delay_s = first_delay_s
        self._max_delay_s = max(first_delay_s, max_delay_s)
        self._scheduled: list[_Retry] = []
        self._held: dict[Any, deque[Received]] = {}
        """Order key of a failing message -> the messages waiting behind it, in order."""
        self._waiting = 0
        """Messages in ``_held``."""
        self._failures: OrderedDict[tuple[str, Position], int] = OrderedDict()
        self._sequence = itertools.count()

    def __len__(self) -> int:
        """Messages held here (unacknowledged)."""
        return len(self._scheduled) + self._waiting

    def next_due(self) -> float | None:
        """When the next retry is due (``time.monotonic()``), if any is scheduled."""
        return self._scheduled[0].due if self._scheduled else None

    def blocks(self, message: Any) -> bool:
        """Whether ``message`` must wait behind a failing message."""
        return bool(self._held) and self._key(message) in self._held

    def hold(self, consumer: Any, message: Any) -> None:
        """Keep ``message`` until the failing message it waits behind is done."""
        self._held[self._key(message)].append((consumer, message))
        self._waiting += 1

    def failed(self, consumer: Any, message: Any, earlier: int = 0) -> Attempt:
        """Count a failure of ``message`` and schedule its next attempt, unless it has no
        retries left (then the caller dead-letters it). ``earlier``: failures this queue
        never saw (the deaths of earlier processes), counted once."""
        failure_key = (message.topic_name(), position(message.message_id()))
        failures = max(self._failures.pop(failure_key, 0), earlier) + 1
        if self._max_retries is not None and failures > self._max_retries:
            return Attempt(failures, retried=False)
        self._failures[failure_key] = failures
        if len(self._failures) > _REMEMBERED_FAILURES:
            self._failures.popitem(last=False)
        delay = min(self._first_delay_s * 2 ** (failures - 1), self._max_delay_s)
        key = self._key(message)
        if self._ordering is not Ordering.NONE:
            self._held.setdefault(key, deque())
        heapq.heappush(
            self._scheduled,
            _Retry(time.monotonic() + delay, next(self._sequence), key, (consumer, message)),
        )
        return Attempt(failures, retried=True)

    def succeeded(self, message: Any) -> None:
        """``message`` was processed: forget its failures."""
        if self._failures:
            self._failures.pop((message.topic_name(), position(message.message_id())), None)

    def due(self, limit: int) -> list[Received]:
        """The messages to process again now: each retry that is due, followed by what
        waited behind it (which waits again if the retry fails again)."""
        ready: list[Received] = []
        now = time.monotonic()
        while self._scheduled and self._scheduled[0].due <= now and len(ready) < limit:
            retry = heapq.heappop(self._scheduled)
            ready.append(retry.received)
            waiting = self._held.pop(retry.key, ())
            self._waiting -= len(waiting)
            ready.extend(waiting)
        return ready

    def clear(self) -> None:
        """Drop every held message (the broker delivers them again after a rewind); their
        failure counts are kept."""
        self._scheduled.clear()
        self._held.clear()
        self._waiting = 0

    def _key(self, message: Any) -> Any:
        if self._ordering is Ordering.ALL:
            return None
        if self._ordering is Ordering.KEY:
            return message.partition_key() or message.ordering_key() or None
        return (message.topic_name(), position(message.message_id()))
