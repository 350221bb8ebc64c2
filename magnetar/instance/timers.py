"""Timers (Couchbase Eventing's createTimer/cancelTimer): code that runs at a time in the
future, armed while processing an input and kept in the function's state.

A timer is two keys of the function's state table, written with the state updates of the
input that armed it, so it is durable once that input is acknowledged (a redelivered input
arms the same reference again, which only replaces it):

* ``TIMER_PREFIX + "ref/" + reference``: the timer (due time, callback, payload) as JSON;
* ``TIMER_PREFIX + "due/" + <due ms, 16 digits> + "/" + reference``: empty. These keys sort
  by due time, so an instance finds the due timers with one range scan of its RocksDB table
  and keeps the pending ones on disk, not in memory.

``PENDING_KEY`` counts the function's pending timers. A reference is owned by one instance
(``owner``): only it fires the timer. Every instance materializes the function's whole table,
so an owner sees the timers any instance arms, and a new owner (after a failover, a restart
elsewhere, a parallelism change) finds them in its table. Deleting the function clears its
state, timers included; stopping it keeps them (the late ones fire on start).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from magnetar.instance.exceptions import InstanceError

__all__ = [
    "MAX_REFERENCE_BYTES",
    "PENDING_KEY",
    "TIMER_PREFIX",
    "Timer",
    "TimerState",
    "Timers",
    "TimersUnavailable",
    "due_key",
    "due_time_ms",
    "owner",
    "parse_due_key",
    "pending_timers",
    "ref_key",
]

TIMER_PREFIX = "\x00timer/"
"""Starts every key of the timers (no user key starts with NUL in practice)."""
PENDING_KEY = TIMER_PREFIX + "pending"
_REF = TIMER_PREFIX + "ref/"
_DUE = TIMER_PREFIX + "due/"
_DUE_DIGITS = 16
MAX_REFERENCE_BYTES = 1024
_ENCODER = json.JSONEncoder(separators=(",", ":"))
_ARMINGS = itertools.count()
_PROCESS = os.urandom(6).hex()
"""With a counter, tells one arming from another (urandom per arming costs more than the
rest of arming)."""


@runtime_checkable
class TimerState(Protocol):
    """What timers need of the function's state store (``JournaledStateStore``)."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...

    def delete(self, key: str) -> None: ...

    def incr(self, key: str, amount: int) -> None: ...

    def get_counter(self, key: str) -> int: ...

    def scan(self, start: str, stop: str, limit: int) -> list[tuple[str, bytes | int]]: ...

    def open(self) -> None: ...

    def commit_unsourced(self) -> None: ...

    def rollback(self) -> None: ...


@dataclass(frozen=True)
class Timer:
    """One armed timer."""

    reference: str
    due_ms: int
    callback: str
    """The callback's name: ``method:<name>`` or ``<module>:<name>`` (Python), or the
    script's top-level function (JavaScript)."""
    payload: Any
    arm_id: str
    """Tells this arming from a later one of the same reference."""

    def encode(self) -> bytes:
        return _ENCODER.encode(
            {
                "due": self.due_ms,
                "callback": self.callback,
                "payload": self.payload,
                "arm": self.arm_id,
            },
        ).encode()

    @classmethod
    def decode(cls, reference: str, raw: bytes) -> Timer:
        data = json.loads(raw)
        return cls(reference, int(data["due"]), data["callback"], data["payload"], data["arm"])

    def to_json(self) -> dict[str, Any]:
        """As REST and the CLI list it."""
        return {
            "reference": self.reference,
            "due": self.due_ms,
            "callback": self.callback.removeprefix("method:"),
            "payload": self.payload,
        }


def ref_key(reference: str) -> str:
    return _REF + reference


def due_key(due_ms: int, reference: str) -> str:
    return f"{_DUE}{due_ms:0{_DUE_DIGITS}d}/{reference}"


def parse_due_key(key: str) -> tuple[int, str]:
    """(due ms, reference) of a ``due_key``."""
    rest = key[len(_DUE) :]
    return int(rest[:_DUE_DIGITS]), rest[_DUE_DIGITS + 1 :]


def due_range(until_ms: int, after_ms: int = 0) -> tuple[str, str]:
    """The keys of the timers due in [after_ms, until_ms]."""
    return due_key(after_ms, ""), due_key(until_ms + 1, "")


def ref_range() -> tuple[str, str]:
    """Every ``ref_key``, in reference order."""
    return _REF, _REF[:-1] + chr(ord("/") + 1)


def owner(reference: str, parallelism: int) -> int:
    """The instance that fires ``reference``'s timer (the same on every worker)."""
    return zlib.crc32(reference.encode()) % max(1, parallelism)


def due_time_ms(when: Any) -> int:
    """``when`` (epoch seconds, or a datetime; a naive one is local time) in epoch ms,
    rounded up so a timer never fires before it."""
    if isinstance(when, datetime):
        seconds = when.timestamp()
    elif isinstance(when, int | float) and not isinstance(when, bool):
        seconds = float(when)
    else:
        raise TypeError(
            f"a timer's time must be epoch seconds (int or float) or a datetime, got "
            f"{type(when).__name__} {when!r}"
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a timer's time must be a finite time after 1970, got {when!r}")
    return math.ceil(seconds * 1000)


def _check_reference(reference: Any) -> str:
    if not isinstance(reference, str) or not reference:
        raise TypeError(f"a timer's reference must be a non-empty str, got {reference!r}")
    if len(reference.encode()) > MAX_REFERENCE_BYTES:
        raise ValueError(
            f"a timer's reference may take at most {MAX_REFERENCE_BYTES} bytes of UTF-8, "
            f"{reference[:40]!r}... takes {len(reference.encode())}"
        )
    return reference


def pending_timers(
    scan: Callable[[str, str, int], list[tuple[str, bytes | None]]], limit: int
) -> list[Timer]:
    """Up to ``limit`` pending timers, soonest first, from a scan of a state table (keys and
    values)."""
    start, stop = due_range(10**_DUE_DIGITS - 2)
    found: list[Timer] = []
    for key, _ in scan(start, stop, limit):
        due_ms, reference = parse_due_key(key)
        for _, raw in scan(ref_key(reference), ref_key(reference) + "\x00", 1):
            if raw is not None:
                timer = Timer.decode(reference, raw)
                if timer.due_ms == due_ms:
                    found.append(timer)
    return found


class TimersUnavailable:
    """The timers of an instance without a journaled state store: every call says why."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def arm(self, callback: str, when: Any, reference: str, payload: Any = None) -> None:
        raise InstanceError(self._reason)

    def cancel(self, reference: str) -> bool:
        raise InstanceError(self._reason)


class Timers:
    """Arming and cancelling, as part of the current input's state updates."""

    def __init__(self, state: TimerState) -> None:
        self.state = state
        self.used = False
        """A timer was armed or cancelled by this process."""

    def arm(self, callback: str, when: Any, reference: str, payload: Any = None) -> None:
        """Arm (or re-arm) ``reference`` to call ``callback(payload, ...)`` at ``when``."""
        reference = _check_reference(reference)
        due_ms = due_time_ms(when)
        self.used = True
        try:
            timer = Timer(reference, due_ms, callback, payload, f"{_PROCESS}-{next(_ARMINGS)}")
            encoded = timer.encode()
        except (TypeError, ValueError) as error:
            raise TypeError(
                f"timer {reference!r}: the payload must be JSON (dict, list, str, number, "
                f"bool or None): {error}"
            ) from None
        state = self.state
        old = state.get(ref_key(reference))
        if old is None:
            state.incr(PENDING_KEY, 1)
        else:
            state.delete(due_key(Timer.decode(reference, old).due_ms, reference))
        state.put(ref_key(reference), encoded)
        state.put(due_key(due_ms, reference), b"")

    def cancel(self, reference: str) -> bool:
        """Cancel ``reference``'s timer; whether one was pending."""
        reference = _check_reference(reference)
        self.used = True
        old = self.state.get(ref_key(reference))
        if old is None:
            return False
        self._remove(Timer.decode(reference, old))
        return True

    def get(self, reference: str) -> Timer | None:
        raw = self.state.get(ref_key(reference))
        return None if raw is None else Timer.decode(reference, raw)

    def remove_fired(self, timer: Timer) -> None:
        """Remove a fired timer, unless it was re-armed (or cancelled) since."""
        if self.get(timer.reference) == timer:
            self._remove(timer)

    def _remove(self, timer: Timer) -> None:
        state = self.state
        state.delete(ref_key(timer.reference))
        state.delete(due_key(timer.due_ms, timer.reference))
        state.incr(PENDING_KEY, -1)
