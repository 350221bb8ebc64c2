"""Firing an instance's due timers on the instance's thread, between chunks of inputs.

The instance scans its state table for timers due now that it owns (see ``timers``), and
fires each on a chunk of its own: the callback's result is sent like a result of
``process`` and its state updates go out as one journal record. Only once that chunk is
persisted is the timer removed (in a later chunk, and only if the callback did not re-arm
it), so a crash in between fires it again: at least once, never lost. Under EFFECTIVELY_ONCE
on a broker that deduplicates, ``timer_once`` makes a firing exactly once instead: the
removal goes in the firing's own record, and the output follows it. A callback that raises
is retried after a backoff and, its retries used up, its timer goes to the dead-letter topic
(the payload as JSON, with the reference and callback as properties).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from magnetar.instance.delivery import Chunk
from magnetar.instance.exceptions import TimerCallbackError
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.timer_once import OnceFirings
from magnetar.instance.timers import PENDING_KEY, Timer, Timers, due_range, owner, parse_due_key

__all__ = [
    "TIMER_CALLBACK",
    "TIMER_REFERENCE",
    "TimerRunner",
    "dead_letter_payload",
    "timer_properties",
]

TIMER_REFERENCE = "TIMER_REFERENCE"
"""Property of a timer's output and dead letter: the timer's reference."""
TIMER_CALLBACK = "TIMER_CALLBACK"

_POLL_S = 0.01
"""How often the table is looked at for due timers (a RocksDB seek when none is due)."""
_SCAN_PAGE = 1000
_CROWDED_POLL_S = 0.1
"""The pause after a poll that found only other instances' due timers (an owner that is
late or gone): looking through them every 10 ms would take this instance's CPU."""
_MAX_SCAN = 20_000
"""Most due keys looked at per poll (those of other instances are skipped)."""
_MAX_FIRINGS = 500
"""Most timers fired in one chunk."""
_PENDING_EVERY_S = 1.0

Fire = Callable[[Timer], Any]
"""Calls a timer's callback; returns what it returns (the output), raises what it raises."""
Send = Callable[[Chunk, Timer, Any], None]
"""Sends a callback's result (not None) as part of a chunk."""
DeadLetter = Callable[[Chunk, Timer], str]
"""Sends a given-up timer to the dead-letter topic as part of a chunk; the topic."""


class TimerRunner:
    """Fires the due timers one instance owns (see the module doc)."""

    def __init__(
        self,
        timers: Timers,
        instance_id: int,
        parallelism: int,
        fire: Fire,
        send: Send,
        dead_letter: DeadLetter,
        rollback: Callable[[], None],
        metrics: InstanceMetrics,
        logger: logging.Logger,
        max_retries: int | None,
        retry_delay_s: float,
        max_retry_delay_s: float,
        enabled: bool,
        once: OnceFirings | None = None,
    ) -> None:
        """``enabled``: the function is known to use timers (else the runner starts once
        it arms one: looking for due timers materializes the state table); ``once``:
        firings are exactly once (EFFECTIVELY_ONCE, see ``timer_once``)."""
        self._enabled = enabled
        self._once = once
        self._timers = timers
        self._state = timers.state
        self._instance_id = instance_id
        self._parallelism = parallelism
        self._fire = fire
        self._send = send
        self._dead_letter = dead_letter
        self._rollback = rollback
        self._metrics = metrics
        self._logger = logger
        self._max_retries = max_retries
        self._retry_delay_s = retry_delay_s
        self._max_retry_delay_s = max_retry_delay_s
        self._in_flight: dict[str, Timer] = {}
        """Fired, not yet removed: reference -> timer."""
        self._by_chunk: dict[int, list[Timer]] = {}
        self._to_remove: list[Timer] = []
        self._failures: dict[str, tuple[int, float]] = {}
        """reference -> (failures, monotonic time of the next attempt)."""
        self._next_poll = 0.0
        self._next_pending = 0.0

    def open(self) -> None:
        """With timers in use, materialize the state table now, so timers that fell due
        while the function was stopped fire at once."""
        if self._enabled:
            self._state.open()

    @property
    def active(self) -> bool:
        return self._enabled or self._timers.used

    def wake_in_s(self) -> float | None:
        """How long the instance may wait for input before looking again."""
        if not self.active:
            return None
        if self.removals:
            return 0.0
        return max(0.0, self._next_poll - time.monotonic())

    def due(self) -> bool:
        """Whether ``fire_due`` has work now."""
        return self.active and (self.removals or time.monotonic() >= self._next_poll)

    @property
    def removals(self) -> bool:
        """Fired timers whose firing is persisted wait to be removed (or, exactly once,
        outbox entries whose output is persisted wait to be deleted)."""
        return bool(self._to_remove) or (self._once is not None and self._once.acks_waiting)

    def remove_settled(self) -> None:
        """Remove the timers whose firings are persisted (their record goes with the
        current chunk)."""
        removed, self._to_remove = self._to_remove, []
        for timer in removed:
            self._timers.remove_fired(timer)
            self._in_flight.pop(timer.reference, None)
        if self._once is not None:
            self._once.acknowledge()
        self._state.commit_unsourced()

    def fire_due(self, chunk: Chunk) -> None:
        """Remove the timers whose firings are persisted, then fire the due ones, as part
        of ``chunk``."""
        now = time.monotonic()
        self._next_poll = now + _POLL_S
        self.remove_settled()
        if self._instance_id == 0 and now >= self._next_pending:
            self._metrics.timers_pending = self._state.get_counter(PENDING_KEY)
            self._next_pending = now + _PENDING_EVERY_S
        once = self._once
        if once is not None:
            once.send(chunk)  # the outbox first: its numbers are below the new firings'
            chunk.on_settled = self._settled
            if not once.may_fire():
                return  # another instance holds this instance's lane still
        fired: list[Timer] = []
        for timer in self._due_timers(now):
            if self._fire_one(chunk, timer):
                fired.append(timer)
        if fired:
            self._by_chunk[id(chunk)] = fired
            chunk.on_settled = self._settled

    def _due_timers(self, now: float) -> list[Timer]:
        now_ms = int(time.time() * 1000)
        start, stop = due_range(now_ms)
        found: list[Timer] = []
        looked = others = 0
        while looked < _MAX_SCAN and len(found) < _MAX_FIRINGS:
            page = self._state.scan(start, stop, _SCAN_PAGE)
            looked += len(page)
            for key, _ in page:
                due_ms, reference = parse_due_key(key)
                if owner(reference, self._parallelism) != self._instance_id:
                    others += 1
                    continue
                if reference in self._in_flight or self._failures.get(reference, (0, 0.0))[1] > now:
                    continue
                timer = self._timers.get(reference)  # also sees this instance's own updates
                if timer is not None and timer.due_ms == due_ms:
                    found.append(timer)
                    if len(found) >= _MAX_FIRINGS:
                        break
            if len(page) < _SCAN_PAGE:
                break
            start = page[-1][0] + "\x00"
        if not found and others >= _SCAN_PAGE:
            self._next_poll = now + _CROWDED_POLL_S
        return found

    def _fire_one(self, chunk: Chunk, timer: Timer) -> bool:
        """Fire ``timer``; whether it is done with (fired, or dead-lettered) once ``chunk``
        is persisted, so it is removed then (an exactly-once firing removes it in its own
        record instead)."""
        self._in_flight[timer.reference] = timer
        metrics = self._metrics
        once = self._once
        try:
            if once is not None:
                once.firing(timer)
            result = self._fire(timer)
            if once is not None:
                # the timer goes in the firing's own record (the state's overlay shows it
                # gone), its output once that record is applied
                once.fired(timer, result)
            elif result is not None:
                self._send(chunk, timer, result)
        except Exception as error:
            self._rollback()
            return self._failed(chunk, timer, error)
        self._failures.pop(timer.reference, None)
        metrics.timers_fired += 1
        metrics.timer_lateness_ms.append(max(0, int(time.time() * 1000) - timer.due_ms))
        if once is not None:
            del self._in_flight[timer.reference]
            return False
        self._state.commit_unsourced()
        return True

    def _failed(self, chunk: Chunk, timer: Timer, error: Exception) -> bool:
        # a script's error reads as the script wrote it, as for its inputs' failures
        self._metrics.record_user_exception(
            str(error) if isinstance(error, TimerCallbackError) else error
        )
        failures = self._failures.get(timer.reference, (0, 0.0))[0] + 1
        where = f"timer {timer.reference!r} ({timer.callback})"
        if failures == 1:
            trace = None if isinstance(error, TimerCallbackError) else error
            self._logger.error("user exception firing %s: %s", where, error, exc_info=trace)
        if self._max_retries is None or failures <= self._max_retries:
            delay = min(self._retry_delay_s * 2 ** (failures - 1), self._max_retry_delay_s)
            self._failures[timer.reference] = (failures, time.monotonic() + delay)
            del self._in_flight[timer.reference]  # fires again after the backoff
            return False
        self._failures.pop(timer.reference, None)
        topic = self._dead_letter(chunk, timer)
        self._metrics.dead_lettered += 1
        self._logger.warning(
            "%s went to the dead-letter topic %s after %d failures: %s",
            where,
            topic,
            failures,
            error,
        )
        return True

    def _settled(self, chunk: Chunk) -> None:
        if self._once is not None:
            self._once.settled(chunk)
        fired = self._by_chunk.pop(id(chunk), [])
        if chunk.error or chunk.failed:
            for timer in fired:  # not persisted: fire it again
                self._in_flight.pop(timer.reference, None)
            return
        self._to_remove += fired


def timer_properties(timer: Timer) -> dict[str, str]:
    """The properties of a timer's output and dead letter."""
    return {TIMER_REFERENCE: timer.reference, TIMER_CALLBACK: timer.callback}


def dead_letter_payload(timer: Timer) -> bytes:
    return json.dumps(timer.payload).encode()
