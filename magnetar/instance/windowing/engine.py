"""The window engine: Apache Pulsar's ``WindowManager`` with its eviction and trigger policies
(Storm's windowing, which Pulsar took over), run on the instance's thread with the clock
passed in, so it is deterministic and restorable.

Events wait in a queue in arrival order. A trigger sets the *reference time* of the eviction
policy and scans the queue: each event is expired (it left the windows), processed (it is in
the window that fires now) or kept (it is for a later window). Which policies apply follows
the config as in Pulsar's ``WindowFunctionExecutor``:

==========================  ===============================  ==============================
window                      eviction (what is in a window)   trigger (when it fires)
==========================  ===============================  ==============================
count, arrival time         the last ``length`` events       every ``sliding`` events, or
                                                             every ``sliding`` ms
duration, arrival time      events of the last ``length``    every ``sliding`` events, or
                            ms (``reference - length``,      every ``sliding`` ms
                            ``reference``]
count, event time           the last ``length`` events up    per watermark: every
                            to the reference time            ``sliding`` events, or each
                                                             window end (a multiple of
duration, event time        events of (``end - length``,     ``sliding`` ms) the watermark
                            ``end``]                         has passed
==========================  ===============================  ==============================

Beyond Pulsar, an event is expired as soon as no later window can hold it, rather than at the
next scan: its input is then acknowledged once the window it was last in has fired.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from magnetar.instance.windowing.config import WindowConfig

__all__ = ["Activation", "EngineState", "Event", "Watermarks", "WindowEngine"]

INITIAL_DELTA = 2**31 - 1
"""Pulsar's window length adjustment for the first time-triggered window: it holds every
event (``Integer.MAX_VALUE``)."""


@dataclass(eq=False, slots=True)
class Event:
    """An input in the windows: its timestamp (ms) and what the caller keeps with it."""

    timestamp: int
    item: Any
    window: int = 0
    """The number of the last window it was in (0: none yet)."""


@dataclass(frozen=True)
class Activation:
    """A window firing."""

    events: list[Event]
    """The window's events, oldest first."""
    new: list[Event]
    """Those not in the previous window."""
    expired: list[Event]
    """Events that left the windows since the previous window fired."""
    start: int | None
    """For a duration window: its end minus its length (exclusive)."""
    end: int | None
    """The reference time the window was computed for (inclusive)."""


@dataclass(frozen=True)
class EngineState:
    """What a restarted engine needs besides its queue (see ``WindowEngine.state``)."""

    counter: int = 0
    reference: int | None = None
    delta: int = 0
    current_count: int = 0
    processed: int = 0
    next_window_end: int = 0
    last_processed_ts: int = 0


class WindowEngine:
    """Windows over events added in arrival order (see the module docstring); each window
    that fires goes to ``on_activation`` at once, with the engine in the state it leaves it
    (so the listener can checkpoint it)."""

    def __init__(self, config: WindowConfig, on_activation: Callable[[Activation], None]) -> None:
        self._on_activation = on_activation
        self._length_count = config.window_length_count
        self._length_ms = config.window_length_duration_ms
        self._sliding_count = config.sliding_interval_count
        self._sliding_ms = config.sliding_interval_duration_ms or 0
        self._event_time = config.event_time
        self.queue: deque[Event] = deque()
        """The events that may still be in a window, in arrival order."""
        self.done: list[Event] = []
        """Expired events the caller has not taken yet (``take_done``)."""
        self._expired: list[Event] = []
        self._windows = 0
        self._previous = 0
        """The number of the last window that held events (0: the last trigger found none)."""
        self._counter = 0
        self._reference: int | None = None
        self._delta = 0
        self._current_count = 0
        self._processed = 0
        self._next_window_end = 0
        self._last_processed_ts = 0
        self._next_fire: int | None = None

    # --- feeding ------------------------------------------------------------------------

    def add(self, event: Event, now_ms: int) -> None:
        """Add an event that arrived at ``now_ms``; a count trigger may fire."""
        self.queue.append(event)
        if self._event_time:
            return  # event-time windows fire on watermarks only
        if self._length_count is not None:
            self._expire_head(self._length_count)
        elif self._sliding_count is not None:
            # the next window ends at a later now: whatever is older than its length is out
            self._expire_until(now_ms - self._length_ms_or_zero())
        if self._sliding_count is None:
            return
        self._counter += 1
        if self._counter >= self._sliding_count:
            self._trigger(now_ms)

    def start(self, now_ms: int) -> None:
        """Start the clock of a window fired every ``slidingIntervalDurationMs``."""
        if not self._event_time and self._sliding_count is None:
            self._next_fire = now_ms + self._sliding_ms

    def next_deadline(self) -> int | None:
        """When ``tick`` fires the next time-triggered window (ms), if the engine has a clock."""
        return self._next_fire

    def tick(self, now_ms: int) -> None:
        """Fire the time-triggered window that is due, if any."""
        if self._next_fire is None or now_ms < self._next_fire:
            return
        while self._next_fire <= now_ms:
            self._next_fire += self._sliding_ms
        # as Pulsar: events of the current millisecond may still arrive, so not this one
        self._trigger(now_ms - 1, sliding_interval=self._sliding_ms)

    def watermark(self, watermark_ms: int) -> None:
        """Event time reached ``watermark_ms``: fire every window it completes."""
        if self._sliding_count is not None:
            for ts in self._sliding_count_timestamps(self._last_processed_ts, watermark_ms):
                self._last_processed_ts = ts
                self._trigger(ts, sliding_count=self._sliding_count)
            return
        end = self._next_window_end
        while end <= watermark_ms:
            current_count = sum(1 for event in self.queue if event.timestamp <= end)
            self._next_window_end = end + self._sliding_ms  # the state a checkpoint keeps
            if self._trigger(end, current_count=current_count):
                end += self._sliding_ms
                continue
            # no event in that window: go to the next window end that has one
            earliest = min(
                (e.timestamp for e in self.queue if end < e.timestamp <= watermark_ms),
                default=None,
            )
            if earliest is None:
                break
            end = -(-earliest // self._sliding_ms) * self._sliding_ms
        self._next_window_end = end

    def take_done(self) -> list[Event]:
        """The events that expired since the last call: no window will hold them again."""
        done, self.done = self.done, []
        return done

    # --- restart ------------------------------------------------------------------------

    def state(self) -> EngineState:
        """The policies' state; with the queue (and which of its events were in the last
        window, ``in_last_window``), all a restarted engine needs."""
        return EngineState(
            self._counter,
            self._reference,
            self._delta,
            self._current_count,
            self._processed,
            self._next_window_end,
            self._last_processed_ts,
        )

    def in_last_window(self, event: Event) -> bool:
        """Whether ``event`` was in the window that fired last."""
        return self._previous != 0 and event.window == self._previous

    def restore(self, state: EngineState, events: Iterable[tuple[Event, bool]]) -> None:
        """Resume from ``state`` with the queue ``events`` (each with whether it was in the
        last window), as ``state`` and ``in_last_window`` described them."""
        self._counter = state.counter
        self._reference = state.reference
        self._delta = state.delta
        self._current_count = state.current_count
        self._processed = state.processed
        self._next_window_end = state.next_window_end
        self._last_processed_ts = state.last_processed_ts
        self._windows = self._previous = 1
        for event, in_last_window in events:
            event.window = 1 if in_last_window else 0
            self.queue.append(event)

    def remove(self, event: Event) -> None:
        """Take ``event`` out of the queue (its input went elsewhere)."""
        self.queue.remove(event)

    # --- the trigger --------------------------------------------------------------------

    def _trigger(
        self,
        reference: int,
        sliding_interval: int | None = None,
        current_count: int | None = None,
        sliding_count: int | None = None,
    ) -> bool:
        """Fire the window at ``reference`` (as Pulsar's ``onTrigger``): whether it held
        events."""
        self._set_context(reference, sliding_interval, current_count, sliding_count)
        window = self._scan()
        expired, self._expired = self._expired, []
        self._counter = 0
        if not window:
            self._previous = 0
            return False
        previous = self._previous
        new = window if previous == 0 else [e for e in window if e.window != previous]
        self._windows += 1
        for event in window:
            event.window = self._windows
        self._previous = self._windows
        start = reference - self._length_ms if self._length_ms is not None else None
        activation = Activation(window, new, expired, start, reference)
        self._expire_beyond_horizon(reference)
        self._on_activation(activation)
        return True

    def _set_context(
        self,
        reference: int,
        sliding_interval: int | None,
        current_count: int | None,
        sliding_count: int | None,
    ) -> None:
        previous, self._reference = self._reference, reference
        if self._length_ms is not None and sliding_interval is not None:
            # Pulsar's drift adjustment: the window reaches back to where the previous one's
            # next window starts, however late this trigger runs
            self._delta = (
                INITIAL_DELTA if previous is None else reference - previous - sliding_interval
            )
        if self._event_time and self._length_count is not None:
            if current_count is not None:
                self._current_count = current_count
            else:
                self._current_count = self._processed + (sliding_count or 0)
            self._processed = 0

    def _scan(self) -> list[Event]:
        """Expire what left the windows; the events of the window at the reference time."""
        if self._length_count is not None and not self._event_time:
            self._expire_head(self._length_count)
            return list(self.queue)
        reference = self._reference
        assert reference is not None
        window: list[Event] = []
        kept: deque[Event] = deque()
        expired: list[Event] = []
        if self._length_count is None:  # a duration
            limit = self._length_ms_or_zero() + self._delta
            for event in self.queue:
                age = reference - event.timestamp
                if age < 0:
                    kept.append(event)  # a later window's
                elif age >= limit:
                    expired.append(event)
                else:
                    kept.append(event)
                    window.append(event)
        else:  # a count, in event time
            current, processed, threshold = self._current_count, 0, self._length_count
            for event in self.queue:
                if event.timestamp <= reference and processed < current:
                    if current > threshold:
                        current -= 1
                        expired.append(event)
                        continue
                    processed += 1
                    window.append(event)
                kept.append(event)
            self._current_count, self._processed = current, processed
        self.queue = kept
        self._expire(expired)
        return window

    def _expire_beyond_horizon(self, reference: int) -> None:
        """Expire the events no later window can hold (their inputs can be acknowledged)."""
        if self._length_count is not None:
            if self._sliding_count is not None and not self._event_time:
                self._expire_head(max(0, self._length_count - self._sliding_count))
            return
        if self._sliding_count is not None:
            return  # the next window ends at a time not known yet
        # the next window starts at reference + sliding - length (delta keeps it there)
        horizon = reference + self._sliding_ms - self._length_ms_or_zero()
        if self._event_time:
            expired = [event for event in self.queue if event.timestamp <= horizon]
            if expired:
                self.queue = deque(event for event in self.queue if event.timestamp > horizon)
                self._expire(expired)
        else:
            self._expire_until(horizon)

    def _expire_head(self, keep: int) -> None:
        queue = self.queue
        while len(queue) > keep:
            self._expire((queue.popleft(),))

    def _expire_until(self, horizon: int) -> None:
        """Expire events at or before ``horizon`` from the head (arrival time only grows)."""
        queue = self.queue
        while queue and queue[0].timestamp <= horizon:
            self._expire((queue.popleft(),))

    def _expire(self, events: Iterable[Event]) -> None:
        for event in events:
            self._expired.append(event)
            self.done.append(event)

    def _sliding_count_timestamps(self, start: int, end: int) -> list[int]:
        """The reference times of the count windows in (``start``, ``end``]: the newest
        timestamp seen at every ``sliding``-th event of that range, in arrival order."""
        sliding = self._sliding_count or 1
        timestamps: list[int] = []
        if end > start:
            count, newest = 0, None
            for event in self.queue:
                if start < event.timestamp <= end:
                    newest = event.timestamp if newest is None else max(newest, event.timestamp)
                    count += 1
                    if count % sliding == 0:
                        timestamps.append(newest)
        return timestamps

    def _length_ms_or_zero(self) -> int:
        return self._length_ms or 0


class Watermarks:
    """Event time across the input topics (Pulsar's ``WaterMarkEventGenerator``): every
    ``interval_ms``, the watermark becomes the oldest of the newest timestamps seen on each
    topic, minus the lag, once every input has had an event. An event older than the last
    watermark is late."""

    def __init__(self, inputs: int, lag_ms: int, interval_ms: int) -> None:
        self._inputs = inputs
        self._lag_ms = lag_ms
        self._interval_ms = interval_ms
        self.last = 0
        """The last watermark emitted (ms)."""
        self.newest: dict[str, int] = {}
        """The newest timestamp seen per topic."""
        self._next_emit: int | None = None

    def start(self, now_ms: int) -> None:
        self._next_emit = now_ms + self._interval_ms

    def next_deadline(self) -> int | None:
        return self._next_emit

    def track(self, topic: str, timestamp: int) -> bool:
        """Note an event's timestamp; False if it is late."""
        if timestamp > self.newest.get(topic, timestamp - 1):
            self.newest[topic] = timestamp
        return timestamp >= self.last

    def due(self, now_ms: int) -> int | None:
        """The new watermark, if one is due now and event time has advanced."""
        if self._next_emit is None or now_ms < self._next_emit:
            return None
        self._next_emit = now_ms + self._interval_ms
        watermark = -self._lag_ms
        if self.newest and len(self.newest) >= self._inputs:
            watermark = min(self.newest.values()) - self._lag_ms
        if watermark <= self.last:
            return None
        self.last = watermark
        return watermark
