"""Firing windows: the function is called once per window with the list of the window's values,
in the order the windows fired, and what it returns is published once per window.

A window whose call fails is called again after the instance's backoff (``retry_delay_ms``,
doubling up to ``max_retry_delay_ms``); the windows after it wait, so outputs stay in order.
Once it has failed ``maxMessageRetries`` + 1 times, its inputs go to the dead-letter topic
(each input once, however many failed windows held it) and the windows go on. Under
ATMOST_ONCE a failed window is dropped.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from magnetar.instance.dead_letter import DeadLetters
from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.invocation import Invoker
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.outputs import Outputs
from magnetar.instance.serde import SerDe
from magnetar.instance.state import JournaledState
from magnetar.instance.windowing.checkpoint import Checkpoint
from magnetar.instance.windowing.deliveries import Input
from magnetar.instance.windowing.engine import Activation, Event
from magnetar.instance.windowing.window import Window, WindowRecord

__all__ = ["MAX_OUTPUT_BYTES", "Backoff", "PendingWindow", "WindowFiring"]

MAX_OUTPUT_BYTES = 5 * 1024 * 1024 - 16 * 1024
"""The largest output a window publishes: Pulsar's default ``maxMessageSize`` (5 MiB) less room
for the message's metadata. A larger one fails the window (retried, then dead-lettered)
rather than a send the client would refuse."""


@dataclass(frozen=True)
class Backoff:
    """How failed windows are retried."""

    first_delay_s: float
    max_delay_s: float
    max_retries: int | None
    """Retries before the window's inputs are dead-lettered; None: without limit."""
    retry: bool
    """False under ATMOST_ONCE: a failed window is dropped."""


@dataclass(eq=False)
class PendingWindow:
    """A window that fired and waits for its call to succeed."""

    activation: Activation
    done: list[Event]
    """Inputs no window holds any more, as of this window: acknowledged once it is done."""
    checkpoint: Checkpoint | None
    """The windows' state right after it fired."""
    failures: int = 0
    due: float = 0.0
    """When it may be called (``time.monotonic()``)."""


class WindowFiring:
    """The windows that fired, called in order."""

    def __init__(
        self,
        invoker: Invoker,
        output_serde: SerDe,
        outputs: Outputs,
        sender: ChunkSender,
        metrics: InstanceMetrics,
        journal: JournaledState | None,
        dead_letters: DeadLetters,
        logger: logging.Logger,
        backoff: Backoff,
        event_time: bool,
        on_done: Callable[[PendingWindow, Chunk], None],
    ) -> None:
        self._invoker = invoker
        self._output_serde = output_serde
        self._outputs = outputs
        self._sender = sender
        self._metrics = metrics
        self._journal = journal
        self._dead_letters = dead_letters
        self._logger = logger
        self._backoff = backoff
        self._event_time = event_time
        self._on_done = on_done
        self.queue: deque[PendingWindow] = deque()

    def add(self, window: PendingWindow) -> None:
        self.queue.append(window)

    def next_due(self) -> float | None:
        return self.queue[0].due if self.queue else None

    def clear(self) -> None:
        self.queue.clear()

    def fire(self, chunk: Chunk) -> None:
        """Call the windows that are due, in order, as part of ``chunk``."""
        queue = self.queue
        while queue and queue[0].due <= time.monotonic():
            if not self._call(chunk, queue[0]):
                return
            self._on_done(queue.popleft(), chunk)

    def _call(self, chunk: Chunk, pending: PendingWindow) -> bool:
        """Whether the window is done with (else it waits for a retry)."""
        activation = pending.activation
        events = activation.events
        newest: Input = events[-1].item
        context = self._invoker.context
        context.message, context.topic = newest.message, newest.topic
        context.window = Window(
            lambda: _records(events),
            lambda: _records(activation.new),
            lambda: _records(activation.expired),
            activation.start,
            activation.end,
        )
        output = self._outputs.output
        content = None
        try:
            result = self._invoker.call([event.item.value for event in events])
            if result is not None and output is not None:
                content = self._output_serde.serialize(result)
                if len(content) > MAX_OUTPUT_BYTES:
                    raise ValueError(
                        f"the window's output is {len(content):,} bytes, more than a Pulsar "
                        f"message may hold ({MAX_OUTPUT_BYTES:,}): publish parts of it with "
                        "context.publish, or make windows smaller"
                    )
        except Exception as error:
            return self._failed(chunk, pending, error)
        finally:
            context.window = None
        message_id = newest.message.message_id()
        if content is not None:
            kwargs = self._outputs.result_kwargs(
                newest.message, message_id, newest.topic, sequenced=False
            )
            kwargs.pop("event_timestamp", None)  # it describes one input, not a window
            if self._event_time and activation.end:
                kwargs["event_timestamp"] = activation.end
            self._sender.send(chunk, output, content, kwargs)
        if self._journal is not None:
            self._journal.commit(newest.topic, message_id)
        return True

    def _failed(self, chunk: Chunk, pending: PendingWindow, error: Exception) -> bool:
        if self._journal is not None:
            self._journal.rollback()  # its state updates are made again when it is retried
        self._metrics.record_user_exception(error)
        pending.failures += 1
        activation, backoff = pending.activation, self._backoff
        where = f"window of {len(activation.events)} inputs (end {activation.end})"
        if pending.failures == 1:
            self._logger.error("user exception processing %s: %s", where, error, exc_info=error)
        if not backoff.retry:
            return True
        if backoff.max_retries is None or pending.failures <= backoff.max_retries:
            if pending.failures > 1:
                self._logger.warning(
                    "%s failed again (%d failures): %s", where, pending.failures, error
                )
            delay = backoff.first_delay_s * 2 ** (pending.failures - 1)
            pending.due = time.monotonic() + min(delay, backoff.max_delay_s)
            return False
        sent = 0
        for event in activation.events:
            item: Input = event.item
            if not item.dead_lettered:
                self._dead_letters.send(chunk, item.message)
                item.dead_lettered = True
                sent += 1
        self._metrics.dead_lettered += sent
        self._logger.warning(
            "%s went to the dead-letter topic after %d failures (%d inputs): %s",
            where,
            pending.failures,
            sent,
            error,
        )
        return True


def _records(events: list[Event]) -> list[WindowRecord]:
    records = []
    for event in events:
        item: Input = event.item
        message: Any = item.message
        records.append(
            WindowRecord(
                value=item.value,
                message_id=message.message_id(),
                topic=item.topic,
                key=message.partition_key() or None,
                event_time=message.event_timestamp(),
                publish_time=message.publish_timestamp(),
                properties=dict(message.properties()),
                timestamp=event.timestamp,
            )
        )
    return records
