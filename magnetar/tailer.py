"""Replaying a topic in order, forever: the basis of every replicated state in Magnetar
(function metadata, assignments, packages, state journals).

A reader from the earliest message (or from a checkpoint) hands each message to ``apply``
exactly once: readers may deliver a message again (pulsar-lite often does) but never a new
one out of order, so a message whose position is not after the last applied one is skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pulsar

from magnetar.client import open_reader
from magnetar.positions import Position, more_in_batch, position

__all__ = ["TopicTailer"]

log = logging.getLogger(__name__)

_READ_TIMEOUT_MS = 200
_NOTHING: Position = (-1, -1, -1)
_STALL_S = 2.0


class TopicTailer:
    """Applies every message of ``topic`` in order on a thread of its own."""

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        apply: Callable[[Any], None],
        name: str,
        start_after: Any = None,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        """``start_after``: the message id of the last message applied before (a checkpoint);
        None replays from the earliest. ``on_idle`` runs on the tailer's thread whenever
        nothing arrived for a while (to checkpoint, say)."""
        self._client = client
        self._topic = topic
        self._apply = apply
        self._name = name
        self._on_idle_hook = on_idle
        start = _NOTHING if start_after is None else position(start_after)
        self._applied: Position = start
        self._read: Position = start
        self._last_id: Any = pulsar.MessageId.earliest if start_after is None else start_after
        self._last_progress = time.monotonic()
        self._last_check = 0.0
        self._progress = threading.Condition()
        self._caught_up = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._probe: Any = None
        self._probe_after = b""
        self._probe_lock = threading.Lock()

    def start(self) -> None:
        self._reader = open_reader(self._client, self._topic, self._last_id)
        self._thread = threading.Thread(target=self._run, name=f"tail-{self._name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._probe_lock:
            readers = [self._reader, self._probe]
            self._probe = None
        for reader in readers:
            try:
                if reader is not None:
                    reader.close()
            except Exception as error:
                log.debug("closing a %s reader failed: %s", self._name, error)

    def wait_caught_up(self, timeout: float) -> bool:
        """Wait until everything published before the tailer started has been applied."""
        return self._caught_up.wait(timeout)

    def catch_up(self, timeout: float) -> bool:
        """Wait until everything published so far has been applied (a new leader's view)."""
        deadline = time.monotonic() + timeout
        while self._has_more():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        with self._progress:
            return self._progress.wait_for(
                lambda: self._applied >= self._read, max(0.0, deadline - time.monotonic())
            )

    def wait_applied(self, message_id: Any, timeout: float) -> bool:
        """Wait until the message ``message_id`` (or a later one) has been applied."""
        target = position(message_id)
        with self._progress:
            return self._progress.wait_for(lambda: self._applied >= target, timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                message = self._reader.read_next(_READ_TIMEOUT_MS)
            except pulsar.Timeout:
                self._on_idle()
                continue
            except Exception as error:
                if self._stop.is_set():
                    return
                log.warning("reading %s failed: %s; retrying", self._topic, error)
                self._stop.wait(0.5)
                continue
            self._last_progress = time.monotonic()
            current = position(message.message_id())
            if current <= self._applied:
                continue
            self._read = current
            self._last_id = message.message_id()
            try:
                self._apply(message)
            except Exception:
                log.exception("applying a record of %s failed; it is skipped", self._topic)
            with self._progress:
                self._applied = current
                self._progress.notify_all()

    def _on_idle(self) -> None:
        """Nothing arrived: note being caught up, and replace a reader that stopped
        delivering (pulsar-lite readers sometimes stall mid-topic)."""
        if self._on_idle_hook is not None:
            try:
                self._on_idle_hook()
            except Exception:
                log.exception("the idle work of the %s tailer failed", self._name)
        now = time.monotonic()
        if self._caught_up.is_set() and now - self._last_check < _STALL_S:
            return
        self._last_check = now
        if not self._has_more():
            self._caught_up.set()
        elif now - self._last_progress > _STALL_S:
            log.warning("the %s reader stopped delivering; reopening it", self._name)
            stalled, self._reader = (
                self._reader,
                open_reader(self._client, self._topic, self._last_id),
            )
            self._last_progress = now
            try:
                stalled.close()
            except Exception as error:
                log.debug("closing a stalled reader failed: %s", error)

    def _has_more(self) -> bool:
        """Whether the topic holds a message after the last one read (and recorded).

        Asked of a reader of its own that starts after that message and never reads: the
        tailing reader's answer compares with what its client has dequeued, which runs ahead
        of what this thread has recorded, so a check between the two said "nothing more"
        with a message unapplied (a state query on a restarted worker answered short)."""
        last = self._last_id
        if more_in_batch(last):
            # pulsar-lite names the last entry, not message, as the topic's last: a reader
            # started inside a batch hears "nothing more" until the batch's rest arrives
            return True
        after = last.serialize()
        with self._probe_lock:
            try:
                if self._probe_after != after and self._reader.has_message_available():
                    return True  # not even dequeued yet; spares a new probe while catching up
                return bool(self._probe_reader(last, after).has_message_available())
            except Exception:
                # The broker cannot give the last message id of an empty topic: nothing to
                # read. Any other failure: ask again.
                self._drop_probe()
                return self._applied != _NOTHING

    def _probe_reader(self, last: Any, after: bytes) -> Any:
        """A reader starting after ``last`` (serialized: ``after``), kept while ``last`` is
        the last message read."""
        if self._probe is None or self._probe_after != after:
            self._drop_probe()
            self._probe = open_reader(self._client, self._topic, last, receiver_queue_size=1)
            self._probe_after = after
        return self._probe

    def _drop_probe(self) -> None:
        if self._probe is not None:
            try:
                self._probe.close()
            except Exception as error:
                log.debug("closing the %s probe failed: %s", self._name, error)
        self._probe = None
