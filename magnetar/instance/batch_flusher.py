"""Sending producers' open batches early, from a thread of its own.

Without more input waiting, nothing is gained by holding a batch for its publish delay (the
10 ms delay was most of a light stream's latency), so the instance asks for its open batches
to go out now. It must not ask from its own thread: the client's ``flush_async`` binding holds
the GIL while it waits for the producer's lock, and the client's I/O thread holds that lock
while it waits for the GIL to hand over a send callback — a deadlock that stops every
producer and consumer of the client. ``Producer.flush()`` releases the GIL while it waits, but
it blocks until the broker answers, so a thread of its own calls it and the instance goes on.
That thread starts with the flusher, before any user code runs: once a function holds all the
memory ``resources.ram`` allows, no thread can start, and a late one would end the instance
with "can't start new thread" instead of failing the function's messages with MemoryError.

Producers sent on natively (``native_sends``) are flushed from the instance's thread instead,
through the client's C API with the GIL released; this thread flushes the others.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

__all__ = ["BatchFlusher"]


class BatchFlusher:
    """Flushes the producers it is handed, coalescing requests that arrive meanwhile."""

    def __init__(self, name: str) -> None:
        self._lock = threading.Lock()
        self._wanted: set[Any] = set()
        self._wake = threading.Event()
        self._closed = False
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def request(self, producers: set[Any]) -> None:
        """Have ``producers`` flushed soon; returns at once."""
        with self._lock:
            if self._closed:
                return
            self._wanted |= producers
        self._wake.set()

    def close(self) -> None:
        """Stop flushing; a flush under way ends with its producer's close."""
        with self._lock:
            self._closed = True
            self._wanted.clear()
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                if self._closed:
                    return
                producers, self._wanted = self._wanted, set()
            for producer in producers:
                with contextlib.suppress(Exception):  # a closed producer: its sends fail anyway
                    producer.flush()
