"""Acknowledging inputs only after their outputs are persisted, without a callback per message.

A Python callback per sent message costs a GIL hand-off to the client's I/O thread for every
message, which caps a Python producer far below what the client can do. A Pulsar producer
completes its sends in order, and a failure (timeout, closed producer) fails every send still
pending after it, so one callback on the *last* send of a chunk of inputs on each producer
tells whether the whole chunk is persisted. Sends that can fail on their own (a message too
large for the broker) get a callback of their own, and such a failure redelivers only the
input that produced the send.

``Chunk`` is the unit: the inputs to acknowledge and the number of callbacks still to come.
``ChunkSender`` holds back each producer's latest send so it can be the one that carries the
callback when the chunk is sealed. Callbacks only record the outcome; the instance's own
thread acknowledges. Sends through the C API (``native_sends``) have theirs recorded in a
``Ledger`` without the GIL; the others' Python callbacks append to a deque.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pulsar

from magnetar.instance.batch_flusher import BatchFlusher
from magnetar.instance.native_sends import native_ledger, native_sender

__all__ = ["Chunk", "ChunkSender", "Completion"]

Completion = tuple["Chunk", Any, Any]
"""A chunk, the result of one of its send callbacks (``pulsar.Result``), and the input
message whose send it was when that send can fail alone (else None)."""


@dataclass(eq=False)
class Chunk:
    """Inputs processed together whose acknowledgement waits on their sends."""

    inputs: list[Any] = field(default_factory=list)
    """(consumer, message) pairs to acknowledge when every send succeeded."""
    pending: int = 0
    """Send callbacks still to arrive."""
    error: str = ""
    """The first failure that fails every input of the chunk, if any."""
    failed: dict[int, str] = field(default_factory=dict)
    """``id()`` of an input message -> why a send of its own failed (only it is redelivered)."""
    settled: bool = False
    """Acknowledged (or redelivered) already; a late send cannot settle it twice."""
    state: Any = None
    """The batch of state journal records sent with the chunk (settled with it), if any."""
    on_settled: Callable[[Chunk], None] | None = None
    """Told when the chunk is settled (its ``error`` and ``failed`` say how its sends
    ended)."""


@dataclass
class _HeldSend:
    content: bytes
    kwargs: dict[str, Any]
    user_callback: Callable[[Any, Any], None] | None
    owner: Any = None
    """The input message this send belongs to, for sends that can fail alone."""


class ChunkSender:
    """Sends messages for the current chunk; see the module docstring."""

    def __init__(self, large_message_bytes: int, name: str = "instance") -> None:
        self._large = large_message_bytes
        self._held: dict[Any, _HeldSend] = {}
        self._unflushed: set[Any] = set()
        """Producers sent on since the last ``flush``: their batches may still be open."""
        self._unflushed_since = 0.0
        """When the oldest of those batches was opened (``time.monotonic``)."""
        self._flusher = BatchFlusher(f"{name}-flusher")
        self._native: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        """Producer -> its ``native_sender`` (or None), for sends that need no message id."""
        self._ledger = native_ledger()
        """Where the native sends record their outcomes (None where not built)."""
        self._completed = threading.Event()
        self._wake = self._ledger.notify if self._ledger is not None else self._completed.set
        """Wakes ``wait_completed`` when a Python callback has appended a completion."""
        self.completions: deque[Completion] = deque()
        """The Python callbacks' completions (``collect`` adds the native sends')."""

    def send(
        self,
        chunk: Chunk,
        producer: Any,
        content: bytes,
        kwargs: dict[str, Any],
        user_callback: Callable[[Any, Any], None] | None = None,
        owner: Any = None,
    ) -> None:
        """Send ``content`` on ``producer`` as part of ``chunk``, on behalf of the input
        message ``owner``."""
        if len(content) >= self._large or user_callback is not None:
            self._issue(chunk, producer, _HeldSend(content, kwargs, user_callback, owner), True)
            return
        held = self._held.get(producer)
        self._held[producer] = _HeldSend(content, kwargs, None)
        if held is not None:
            self._issue(chunk, producer, held, False)

    def seal(self, chunk: Chunk) -> None:
        """Send every held message of ``chunk`` with its callback. A chunk without sends
        completes at once."""
        held, self._held = self._held, {}
        for producer, send in held.items():
            self._issue(chunk, producer, send, True)
        if chunk.pending == 0:
            self.completions.append((chunk, pulsar.Result.Ok, None))

    def _issue(self, chunk: Chunk, producer: Any, send: _HeldSend, tracked: bool) -> None:
        if tracked:
            chunk.pending += 1
        if not self._unflushed:
            self._unflushed_since = time.monotonic()
        self._unflushed.add(producer)
        try:
            if send.user_callback is not None or not self._sent_natively(
                producer, send, (chunk, send.owner) if tracked else None
            ):
                callback = (
                    self._callback(chunk, send.user_callback, send.owner) if tracked else None
                )
                producer.send_async(send.content, callback, **send.kwargs)
        except Exception as error:  # e.g. producer closed: fail the chunk, never lose it
            if not tracked:
                chunk.pending += 1
            chunk.error = chunk.error or f"send to {producer.topic()} failed: {error}"
            self.completions.append((chunk, pulsar.Result.UnknownError, None))

    def _sent_natively(self, producer: Any, send: _HeldSend, token: Any) -> bool:
        """Sent through the C API; a tracked send's outcome (``token``: its chunk and owner)
        recorded in the ledger."""
        try:
            sender = self._native[producer]
        except KeyError:
            sender = self._native[producer] = native_sender(producer)
        if sender is None or (token is not None and self._ledger is None):
            return False
        if token is None:
            sent = sender.send_async(send.content, None, **send.kwargs)
        else:
            sent = sender.send_recorded(send.content, self._ledger, token, **send.kwargs)
        return sent is not NotImplemented

    def collect(self) -> deque[Completion]:
        """Every completion so far: the Python callbacks', and the native sends' taken from
        the ledger."""
        if self._ledger is not None:
            for (chunk, owner), result in self._ledger.take():
                self.completions.append((chunk, result, owner))
        return self.completions

    def wait_completed(self, timeout_s: float) -> None:
        """Wait until a send completes, or ``timeout_s``."""
        if self._ledger is not None:
            self._ledger.wait(timeout_s)
        else:
            self._completed.wait(timeout_s)
            self._completed.clear()

    def flush(self) -> None:
        """Send the open batches now instead of at the end of their publish delay: here for
        the producers sent on natively (``native_sends``), by the ``BatchFlusher``'s thread
        for the others. Returns at once; completions come as usual."""
        if self._unflushed:
            by_thread = set()
            for producer in self._unflushed:
                sender = self._native.get(producer)
                if sender is None:
                    by_thread.add(producer)
                else:
                    sender.flush_async()
            if by_thread:
                self._flusher.request(by_thread)
            self._unflushed = set()

    def flush_older(self, than_s: float) -> None:
        """``flush`` if a batch has been open ``than_s`` or longer."""
        if self._unflushed and time.monotonic() - self._unflushed_since >= than_s:
            self.flush()

    def close(self) -> None:
        """No more early flushes (the producers' close sends what is left)."""
        self._flusher.close()

    def _callback(
        self, chunk: Chunk, user_callback: Callable[[Any, Any], None] | None, owner: Any
    ) -> Callable[[Any, Any], None]:
        completions, wake = self.completions, self._wake

        def on_sent(result: Any, message_id: Any) -> None:
            completions.append((chunk, result, owner))
            wake()
            if user_callback is not None:
                # the client aborts the process when a callback raises
                with contextlib.suppress(Exception):
                    user_callback(result, message_id)

        return on_sent
