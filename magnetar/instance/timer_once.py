"""Firing timers exactly once (EFFECTIVELY_ONCE on a broker that deduplicates).

Each firing gets a durable identity before its output leaves: the next number ``X`` of a
*lane*, a sequence of firings kept in the function's state (lane ``i`` is instance ``i``'s).
The firing is one journal record, tagged with (lane, X) so the state table applies it once
(as it applies an input's record once): the lane's count, then a guard (``EXPECT``) that the
timer is still pending as it was armed, then the callback's state changes, the timer's
removal (unless the callback re-armed it) and an *outbox entry* ``firing_key(lane, X)``
(the timer, and which firing wrote it). A number is used up whether or not the guard holds;
what follows the guard applies only while the timer is pending, so two instances that both
fire a timer (an owner change caught midway) change the state once.

The output goes out only once the record is applied, through a producer named after the
lane with sequence id ``X``: the broker drops a repeat of ``X``. Only the instance holding
the lane's producer name (the broker lets one producer hold a name) fires on the lane and
sends its outbox, in ``X`` order. An outbox entry this process has no output for (written by
a process that crashed, or by another instance that held the lane before) is fired again to
compute the output, its state changes dropped (they were applied with the entry), and sent
with its ``X``: a repeat of what reached the topic, which the broker drops, or the output
that never did. Once the send is persisted the entry is deleted. A firing whose record the
table skipped (its number or its timer taken by another firing) sends nothing; its timer,
if still pending, fires again.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.timers import TIMER_PREFIX, Timer, Timers, ref_key

__all__ = ["OnceFirings", "OnceState", "firing_key", "lane_topic"]

log = logging.getLogger(__name__)

_FIRE = TIMER_PREFIX + "fire/"
_LANE = TIMER_PREFIX + "lane/"
_LANE_DIGITS = 6
_X_DIGITS = 19
_OUTBOX_PAGE = 1000
_LANES_EVERY_S = 1.0


@runtime_checkable
class OnceState(Protocol):
    """What exactly-once firings need of the state store (``JournaledStateStore``)."""

    def get_counter(self, key: str) -> int: ...

    def incr(self, key: str, amount: int) -> None: ...

    def expect(self, key: str, value: bytes) -> None: ...

    def put(self, key: str, value: bytes) -> None: ...

    def delete(self, key: str) -> None: ...

    def scan(self, start: str, stop: str, limit: int) -> list[tuple[str, bytes | int]]: ...

    def commit_at(self, source_topic: str, source: tuple[int, int, int]) -> int: ...

    def rollback(self) -> None: ...

    @property
    def confirmed_seq(self) -> int: ...


def firing_key(lane: int, number: int) -> str:
    return f"{_FIRE}{lane:0{_LANE_DIGITS}d}/{number:0{_X_DIGITS}d}"


def _parse_firing_key(key: str) -> tuple[int, int]:
    lane, _, number = key[len(_FIRE) :].partition("/")
    return int(lane), int(number)


def _lane_end(lane: int) -> str:
    """Just past the last ``firing_key`` of ``lane``."""
    return f"{_FIRE}{lane:0{_LANE_DIGITS}d}/\x7f"


def _lane_count_key(lane: int) -> str:
    return f"{_LANE}{lane:0{_LANE_DIGITS}d}"


def lane_topic(lane: int) -> str:
    """The "topic" a lane's records are tagged with (no real topic is named like it)."""
    return f"timers:{lane}"


@dataclass
class _Held:
    """A firing of this process whose record is not known to be applied yet."""

    by: str
    record_seq: int
    content: bytes | None


@dataclass
class _Lane:
    producer: Any = None
    sent_through: int = 0
    """Highest number sent on this producer (its sends in flight or persisted)."""
    failures: dict[int, int] = field(default_factory=dict)


Encode = Callable[[Any], bytes | None]
"""A callback's result as the output's content; None when nothing is published."""


class OnceFirings:
    """The exactly-once firing of one instance's timers (see the module doc)."""

    def __init__(
        self,
        state: OnceState,
        timers: Timers,
        instance_id: int,
        parallelism: int,
        lane_producer: Callable[[str], Any],
        lane_name: Callable[[int], str],
        fire: Callable[[Timer], Any],
        encode: Encode,
        properties: Callable[[Timer], dict[str, str]],
        sender: ChunkSender,
        on_refire_error: Callable[[Timer, Exception], None],
        max_retries: int | None,
        has_output: bool,
    ) -> None:
        """``lane_producer(name)``: the output producer of that name, or None while another
        producer holds the name (asked again later). Without an output (``has_output``)
        a firing is only its record: nothing to send, no outbox, no lane to hold."""
        self._state = state
        self._timers = timers
        self._lane = instance_id
        self._parallelism = max(1, parallelism)
        self._instance_id = instance_id
        self._lane_producer = lane_producer
        self._lane_name = lane_name
        self._fire = fire
        self._encode = encode
        self._properties = properties
        self._sender = sender
        self._on_refire_error = on_refire_error
        self._max_retries = max_retries
        self._has_output = has_output
        self._next_number = 1
        """The number the next firing takes (``send`` reads it from the lane's count)."""
        self._writer = os.urandom(6).hex()
        """Who wrote an outbox entry: drawn here, not at import, since instances are forked
        from a fork server that imported this module (they would all draw the same)."""
        self._firings = itertools.count()
        self._held: dict[int, _Held] = {}
        self._lanes: dict[int, _Lane] = {}
        self._other_lanes: list[int] = []
        self._next_lane_scan = 0.0
        self._acks: list[str] = []
        self._by_chunk: dict[int, list[tuple[int, int]]] = {}

    @property
    def acks_waiting(self) -> bool:
        return bool(self._acks)

    def acknowledge(self) -> None:
        """Delete the outbox entries whose sends are persisted, as part of the current
        updates (a number is never used twice: deleting an entry again is harmless)."""
        acks, self._acks = self._acks, []
        for key in acks:
            self._state.delete(key)

    def may_fire(self) -> bool:
        """Whether this instance holds its lane now (else another instance still does)."""
        return not self._has_output or self._producer_of(self._lane) is not None

    def firing(self, timer: Timer) -> None:
        """Start the record of a firing of ``timer``, before its callback runs: the lane's
        next number, and the guard that applies the rest (the callback's state changes,
        the removal, the outbox entry) only while this arming of the timer is pending."""
        state = self._state
        state.incr(_lane_count_key(self._lane), 1)  # before the guard: used up either way
        state.expect(ref_key(timer.reference), timer.encode())

    def fired(self, timer: Timer, result: Any) -> None:
        """End the record of the firing ``firing`` started, whose callback returned
        ``result``: tagged with the firing's number, so it applies once; the output waits
        in memory until the record is applied."""
        state = self._state
        number = self._next_number
        self._next_number += 1
        self._timers.remove_fired(timer)
        if not self._has_output:
            state.commit_at(lane_topic(self._lane), (0, number, -1))
            return
        content = None if result is None else self._encode(result)
        by = f"{self._writer}-{next(self._firings)}"
        state.put(firing_key(self._lane, number), _entry(timer, by))
        record_seq = state.commit_at(lane_topic(self._lane), (0, number, -1))
        self._held[number] = _Held(by, record_seq, content)

    def send(self, chunk: Chunk) -> None:
        """Send the applied firings of this instance's lanes not sent yet, in number order,
        as part of ``chunk``; forget this process's firings that lost their number to
        another (their timers are still pending). Called before each round of firings."""
        # the lane's count as this process sees it (its own firings included, and not those
        # whose journal send failed: no number is skipped), read once per round of firings:
        # read per firing, it would go through every firing still unapplied
        self._next_number = self._state.get_counter(_lane_count_key(self._lane)) + 1
        if not self._has_output:
            return
        confirmed = self._state.confirmed_seq  # before the scans: they hold these
        applied: set[int] = set()
        for lane_number in self._lanes_to_send():
            lane = self._lanes.get(lane_number)
            after = lane.sent_through if lane is not None else 0
            start = firing_key(lane_number, after + 1)
            found: list[tuple[int, dict[str, Any], bytes]] = []
            for key, raw in self._state.scan(start, _lane_end(lane_number), _OUTBOX_PAGE):
                if not isinstance(raw, bytes):
                    continue
                number = _parse_firing_key(key)[1]
                entry = json.loads(raw)
                held = self._held.get(number) if lane_number == self._lane else None
                if held is not None and held.by == entry["by"]:
                    applied.add(number)
                found.append((number, entry, raw))
            if found:
                self._send_lane(chunk, lane_number, found)
        for number, held in list(self._held.items()):
            if held.record_seq <= confirmed and number not in applied:
                del self._held[number]  # another firing took the number

    def _lanes_to_send(self) -> list[int]:
        """This instance's lane, and those of instances gone (a lower parallelism) that
        fall to it and have entries left: looked for at most every ``_LANES_EVERY_S``."""
        now = time.monotonic()
        if now >= self._next_lane_scan:
            self._next_lane_scan = now + _LANES_EVERY_S
            lanes = {self._lane}
            start = _FIRE
            while True:
                page = self._state.scan(start, _FIRE[:-1] + chr(ord("/") + 1), 1)
                if not page:
                    break
                lane = _parse_firing_key(page[0][0])[0]
                if lane % self._parallelism == self._instance_id:
                    lanes.add(lane)
                start = _lane_end(lane)  # the next lane's first entry
            self._other_lanes = sorted(lanes - {self._lane})
        return [self._lane, *self._other_lanes]

    def settled(self, chunk: Chunk) -> None:
        sent = self._by_chunk.pop(id(chunk), [])
        if not sent:
            return
        if chunk.error or chunk.failed:
            for lane_number, number in sent:
                lane = self._lanes.get(lane_number)
                if lane is not None:  # sent again from the outbox
                    lane.sent_through = min(lane.sent_through, number - 1)
            return
        self._acks += [firing_key(lane, number) for lane, number in sent]

    def _send_lane(
        self, chunk: Chunk, lane_number: int, found: list[tuple[int, dict[str, Any], bytes]]
    ) -> None:
        producer = self._producer_of(lane_number)
        if producer is None:
            return
        lane = self._lanes[lane_number]
        sent: list[tuple[int, int]] = []
        for number, entry, raw in found:  # in number order (the keys sort so)
            if number <= lane.sent_through:
                continue
            timer = Timer.decode(entry["ref"], raw)
            held = self._held.get(number) if lane_number == self._lane else None
            if held is not None and held.by == entry["by"]:
                content = held.content
                del self._held[number]
            else:
                try:
                    content = self._refire(timer)
                    lane.failures.pop(number, None)
                except Exception as error:
                    if not self._give_up(lane, number, timer, error):
                        break  # the lane's later numbers wait: they must follow this one
                    content = None
            if content is not None:
                kwargs = {"properties": self._properties(timer), "sequence_id": number}
                self._sender.send(chunk, producer, content, kwargs)
            lane.sent_through = number
            sent.append((lane_number, number))
        if sent:
            self._by_chunk.setdefault(id(chunk), []).extend(sent)

    def _refire(self, timer: Timer) -> bytes | None:
        """The output of a firing applied before (by a process that did not send it): the
        callback again, its state changes dropped (they were applied with the firing)."""
        try:
            result = self._fire(timer)
        finally:
            self._state.rollback()
        return None if result is None else self._encode(result)

    def _give_up(self, lane: _Lane, number: int, timer: Timer, error: Exception) -> bool:
        self._on_refire_error(timer, error)
        failures = lane.failures.get(number, 0) + 1
        lane.failures[number] = failures
        if self._max_retries is not None and failures > self._max_retries:
            log.error(
                "timer %r fired (its state changes applied) but its output could not be "
                "computed again after %d attempts; it is not sent: %s",
                timer.reference,
                failures,
                error,
            )
            del lane.failures[number]
            return True
        return False

    def _producer_of(self, lane_number: int) -> Any:
        lane = self._lanes.get(lane_number)
        producer = self._lane_producer(self._lane_name(lane_number))
        if producer is None:
            return None
        if lane is None or lane.producer is not producer:
            # a producer of our own, new: what the last one sent is persisted or failed
            self._lanes[lane_number] = _Lane(producer)
        return producer


def _entry(timer: Timer, by: str) -> bytes:
    data = json.loads(timer.encode())
    data["ref"] = timer.reference
    data["by"] = by
    return json.dumps(data, separators=(",", ":")).encode()
