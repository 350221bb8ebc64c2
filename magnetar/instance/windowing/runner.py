"""The windows of a function instance: messages go into the window engine as they arrive, the
windows that fire are called in order (``firing``), and each input is acknowledged once the
last window that can hold it has fired and its output is persisted.

With a state store, the windows survive a restart: after each window, once its outputs are
persisted, a checkpoint is written to the store (``checkpoint``), and the inputs that left
the windows are acknowledged once it is persisted. A restarted instance reads the checkpoint
and waits (up to ``window_restore_timeout_s``) for the inputs still in the windows to be
delivered again before any window fires; new inputs wait meanwhile. A send that fails (an
output may be lost) makes the windows resume the same way from the last checkpoint, the
subscription rewound. Without a state store a restart windows the unacknowledged inputs
anew, as Apache Pulsar does.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from magnetar.instance.config import FunctionConfig, ProcessingGuarantees
from magnetar.instance.dead_letter import DeadLetters
from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.failures import FailureHandler
from magnetar.instance.inputs import Inputs
from magnetar.instance.invocation import Invoker
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.options import InstanceOptions
from magnetar.instance.outputs import Outputs
from magnetar.instance.retries import Received
from magnetar.instance.serde import SerDe, TopicSerDes
from magnetar.instance.state import JournaledState
from magnetar.instance.windowing.checkpoint import (
    Buffered,
    Checkpoint,
    CheckpointQueue,
    DoneRuns,
    checkpoint_key,
)
from magnetar.instance.windowing.deliveries import Deliveries, Delivery, Input
from magnetar.instance.windowing.engine import Activation, Event, Watermarks, WindowEngine
from magnetar.instance.windowing.extractors import TimestampOf
from magnetar.instance.windowing.firing import Backoff, PendingWindow, WindowFiring
from magnetar.positions import Position, position
from magnetar.statestore.exceptions import StateStoreError

__all__ = ["WindowRunner"]

log = logging.getLogger(__name__)

_MAX_PENDING_WINDOWS = 1000
"""Windows waiting behind a failing one before the instance stops taking input."""
_CHECKPOINT_POLL_S = 0.005


def _now_ms() -> int:
    return int(time.time() * 1000)


class WindowRunner:
    """Feeds chunks of messages to the windows and fires them (see the module docstring)."""

    def __init__(
        self,
        config: FunctionConfig,
        options: InstanceOptions,
        invoker: Invoker,
        input_serdes: TopicSerDes,
        output_serde: SerDe,
        outputs: Outputs,
        sender: ChunkSender,
        metrics: InstanceMetrics,
        inputs: Inputs,
        failures: FailureHandler,
        dead_letters: DeadLetters,
        journal: JournaledState | None,
        logger: logging.Logger,
        timestamp_of: TimestampOf | None,
    ) -> None:
        window = config.window_config
        assert window is not None
        self._window = window
        self._fqfn = config.fqfn
        self._options = options
        self._invoker = invoker
        self._input_serdes = input_serdes
        self._outputs = outputs
        self._sender = sender
        self._metrics = metrics
        self._inputs = inputs
        self._retries = inputs.retries
        self._failures = failures
        self._logger = logger
        self._timestamp_of = timestamp_of
        self._at_most_once = config.processing_guarantees is ProcessingGuarantees.ATMOST_ONCE
        self._journal = None if self._at_most_once else journal
        """Where checkpoints go (none under ATMOST_ONCE: its inputs are acknowledged)."""
        self._key = checkpoint_key(options.instance_id)
        self._fingerprint = "/".join(
            str(part)
            for part in (
                window.window_length_count,
                window.window_length_duration_ms,
                window.sliding_interval_count,
                window.sliding_interval_duration_ms,
                window.event_time,
            )
        )
        self._input_count = len(config.input_serdes()) + len(config.input_patterns())
        self._progress = CheckpointQueue()
        self._progress.on_failure = self._chunk_failed
        self._firing = WindowFiring(
            invoker,
            output_serde,
            outputs,
            sender,
            metrics,
            journal,
            dead_letters,
            logger,
            Backoff(
                options.retry_delay_ms / 1000,
                options.max_retry_delay_ms / 1000,
                config.max_message_retries,
                retry=not self._at_most_once,
            ),
            window.event_time,
            self._window_done,
        )
        self._engine = WindowEngine(window, self._activated)
        self._watermarks: Watermarks | None = None
        self._deliveries = Deliveries()
        self._held: list[tuple[Any, Any, int]] = []
        """New inputs waiting for a restore to finish: (consumer, message, arrival ms)."""
        self._restore_deadline: float | None = None
        self._resume_requested = False

    # --- lifecycle ----------------------------------------------------------------------

    busy = False
    """Windows that are due are fed by the instance (``due_in_s``), not by ``busy``."""

    def wait(self, chunk: Chunk, timeout_s: float) -> None:
        """Fired windows settle with the acknowledger; the last checkpoint is ``flush``."""

    def close(self) -> None:
        """Nothing to release."""

    def open(self) -> None:
        """Resume from the checkpoint in the state store, if there is one."""
        self._resume(self._load())

    def timeouts(self) -> Any:
        """Enforce ``timeoutMs`` on window calls while this context is open."""
        return self._invoker.timeouts()

    def accepts_input(self) -> bool:
        """False while too many windows wait behind a failing one (or a restore)."""
        return (
            len(self._firing.queue) < _MAX_PENDING_WINDOWS
            and len(self._held) < self._options.max_unacked
        )

    def due_in_s(self) -> float | None:
        """How long until the windows have something to do without input (None: never)."""
        deadlines: list[float] = []
        now_s = time.time()
        monotonic = time.monotonic()
        if self._restore_deadline is not None:
            return max(0.0, self._restore_deadline - monotonic)
        for deadline_ms in (
            self._engine.next_deadline(),
            self._watermarks.next_deadline() if self._watermarks else None,
        ):
            if deadline_ms is not None:
                deadlines.append(deadline_ms / 1000 - now_s)
        retry = self._firing.next_due()
        if retry is not None:
            deadlines.append(retry - monotonic)
        if self._progress.has_ready():
            deadlines.append(0.0)
        elif self._progress.waiting():
            deadlines.append(_CHECKPOINT_POLL_S)  # to look again soon, as its chunks settle
        return max(0.0, min(deadlines)) if deadlines else None

    def run(self, chunk: Chunk, received: list[Received]) -> None:
        """Process ``received`` in order as part of ``chunk``, then fire what is due."""
        if self._resume_requested:
            self._resume_requested = False
            self._progress.reset()
            self._resume(self._progress.written)
        if not self._at_most_once:
            self._progress.track(chunk)
        now = _now_ms()
        retries = self._retries
        for consumer, message in received:
            if retries.blocks(message):
                retries.hold(consumer, message)
            else:
                self._receive(chunk, consumer, message, now)
        self._tick(chunk, _now_ms())

    def flush(self, chunk: Chunk) -> None:
        """On stop: write the checkpoint of the windows whose outputs are persisted, so a
        restart fires none of them again."""
        if self._at_most_once or self._resume_requested:
            return
        self._progress.track(chunk)
        self._write_checkpoint(chunk)

    # --- inputs -------------------------------------------------------------------------

    def _receive(self, chunk: Chunk, consumer: Any, message: Any, now: int) -> None:
        self._metrics.received += 1
        if self._at_most_once:
            consumer.acknowledge(message)
        topic = message.topic_name()
        at = position(message.message_id())
        kind = self._deliveries.classify(topic, at, consumer, message)
        if kind is Delivery.NEW:
            if self._restore_deadline is not None:
                self._held.append((consumer, message, now))
            else:
                self._add(chunk, consumer, message, topic, at, now)
        elif kind is Delivery.RESTORED:
            self._restore(chunk, consumer, message, topic, at, now)
        elif kind is Delivery.DONE and not self._at_most_once:
            chunk.inputs.append((consumer, message))  # its acknowledgement may have been lost

    def _add(
        self, chunk: Chunk, consumer: Any, message: Any, topic: str, at: Position, arrival: int
    ) -> None:
        serde = self._input_serdes[topic]
        try:
            value = serde.deserialize(message.data())
        except Exception as error:
            description = (
                f"cannot deserialize message {message.message_id()} from {topic} with "
                f"{type(serde).__name__}: {error!r}"
            )
            self._fail(chunk, consumer, message, topic, at, description, system=True)
            return
        timestamp = arrival
        if self._timestamp_of is not None:
            assert self._watermarks is not None
            try:
                timestamp = self._timestamp_of(value, message)
            except Exception as error:
                self._fail(chunk, consumer, message, topic, at, error, system=False)
                return
            if not self._watermarks.track(topic, timestamp):
                self._late(chunk, consumer, message, topic, at, timestamp)
                return
        event = Event(timestamp, Input(topic, at, consumer, message, value))
        self._deliveries.add(event)
        self._metrics.processed += 1
        self._engine.add(event, arrival)
        self._firing.fire(chunk)

    def _fail(
        self,
        chunk: Chunk,
        consumer: Any,
        message: Any,
        topic: str,
        at: Position,
        error: BaseException | str,
        system: bool,
    ) -> None:
        if self._failures.fail(consumer, message, error, chunk, system=system):
            self._deliveries.forget(topic, at)  # its retry is new again
        else:
            self._deliveries.finished(topic, at, _now_ms())

    def _late(
        self, chunk: Chunk, consumer: Any, message: Any, topic: str, at: Position, timestamp: int
    ) -> None:
        """An input older than the watermark: to the late-data topic, or dropped (logged)."""
        late_topic = self._window.late_data_topic
        if late_topic:
            kwargs: dict[str, Any] = {"properties": dict(message.properties())}
            if message.partition_key():
                kwargs["partition_key"] = message.partition_key()
            if message.event_timestamp():
                kwargs["event_timestamp"] = message.event_timestamp()
            producer = self._outputs.producer(late_topic)
            self._sender.send(chunk, producer, message.data(), kwargs, owner=message)
        else:
            assert self._watermarks is not None
            self._logger.info(
                "late input %s from %s: its timestamp %d is before the watermark %d; it is not "
                "windowed (set lateDataTopic to keep late inputs)",
                message.message_id(),
                topic,
                timestamp,
                self._watermarks.last,
            )
        if not self._at_most_once:
            chunk.inputs.append((consumer, message))
        self._deliveries.finished(topic, at, _now_ms())

    # --- windows ------------------------------------------------------------------------

    def _activated(self, activation: Activation) -> None:
        """A window fired (called by the engine, in the state the window leaves it)."""
        now = _now_ms()
        done = self._engine.take_done()
        for event in done:
            self._deliveries.expired(event, now)
        checkpoint = self._checkpoint(now) if self._journal is not None else None
        self._firing.add(PendingWindow(activation, done, checkpoint))

    def _window_done(self, pending: PendingWindow, chunk: Chunk) -> None:
        """The window's call is over (its outputs went out in ``chunk``)."""
        if self._at_most_once:
            return
        acks = [(event.item.consumer, event.item.message) for event in pending.done]
        if pending.checkpoint is not None:
            newest: Input = pending.activation.events[-1].item
            source = (newest.topic, newest.message.message_id())
            self._progress.add(pending.checkpoint, acks, source)
        else:
            chunk.inputs.extend(acks)

    def _tick(self, chunk: Chunk, now: int) -> None:
        if self._restore_deadline is not None:
            if time.monotonic() < self._restore_deadline:
                return
            self._release_unmatched()
            self._restored(chunk, now)
        if self._watermarks is not None:
            watermark = self._watermarks.due(now)
            if watermark is not None:
                self._engine.watermark(watermark)
        else:
            self._engine.tick(now)
        self._firing.fire(chunk)
        self._write_checkpoint(chunk)

    # --- checkpoints and restores -------------------------------------------------------

    def _checkpoint(self, now: int) -> Checkpoint:
        engine, watermarks = self._engine, self._watermarks
        return Checkpoint(
            fingerprint=self._fingerprint,
            engine=engine.state(),
            watermark=watermarks.last if watermarks else 0,
            newest=dict(watermarks.newest) if watermarks else {},
            buffered=[
                Buffered(
                    event.item.topic,
                    event.item.position,
                    event.timestamp,
                    engine.in_last_window(event),
                )
                for event in engine.queue
            ],
            done=self._deliveries.done.pruned(now),
        )

    def _write_checkpoint(self, chunk: Chunk) -> None:
        checkpoint, acks, source = self._progress.ready()
        if checkpoint is not None and self._journal is not None:
            try:
                self._journal.put(self._key, checkpoint.encode())
            except StateStoreError as error:
                self._logger.warning(
                    "the windows' checkpoint cannot be stored (%s): after a restart, windows "
                    "may fire again",
                    error,
                )
            else:
                assert source is not None
                self._journal.commit(*source)
        chunk.inputs.extend(acks)

    def _load(self) -> Checkpoint | None:
        if self._journal is None:
            return None
        payload = self._journal.get(self._key)
        if payload is None:
            return None
        try:
            checkpoint = Checkpoint.decode(payload)
        except ValueError as error:
            self._logger.warning(
                "state key %s is not a window checkpoint (%s): the windows start empty and "
                "the unacknowledged inputs are windowed anew",
                self._key,
                error,
            )
            return None
        if checkpoint.fingerprint != self._fingerprint:
            self._logger.warning(
                "the windowConfig changed since the last checkpoint: the windows start empty "
                "and the unacknowledged inputs are windowed anew"
            )
            return None
        return checkpoint

    def _resume(self, checkpoint: Checkpoint | None) -> None:
        """Start the windows from ``checkpoint`` (empty without one)."""
        window = self._window
        self._engine = WindowEngine(window, self._activated)
        if window.event_time:
            self._watermarks = Watermarks(
                self._input_count, window.max_lag_ms or 0, window.watermark_emit_interval_ms or 1
            )
        self._firing.clear()
        self._held.clear()
        self._deliveries = Deliveries(DoneRuns(checkpoint.done if checkpoint else None))
        if checkpoint is not None:
            self._engine.restore(checkpoint.engine, self._deliveries.restore(checkpoint.buffered))
            if self._watermarks is not None:
                self._watermarks.last = checkpoint.watermark
                self._watermarks.newest = dict(checkpoint.newest)
        if self._deliveries.unmatched:
            log.info(
                "%s: resuming windows holding %d inputs; waiting for them to be delivered again",
                self._fqfn,
                self._deliveries.unmatched,
            )
            self._restore_deadline = time.monotonic() + self._options.window_restore_timeout_s
        else:
            self._restore_deadline = None
            self._start_clocks(_now_ms())

    def _restore(
        self, chunk: Chunk, consumer: Any, message: Any, topic: str, at: Position, now: int
    ) -> None:
        """An input of the restored windows is delivered again: read its value."""
        event = self._deliveries.buffered[(topic, at)]
        try:
            event.item.value = self._input_serdes[topic].deserialize(message.data())
        except Exception:
            # no longer readable (the SerDe changed?): out of the windows, failed as new
            self._engine.remove(event)
            self._deliveries.buffered.pop((topic, at))
            self._deliveries.forget(topic, at)
            self._add(chunk, consumer, message, topic, at, now)
        if self._deliveries.unmatched == 0 and self._restore_deadline is not None:
            self._restored(chunk, now)

    def _release_unmatched(self) -> None:
        unmatched = [event for event in self._engine.queue if event.item.message is None]
        for event in unmatched:
            self._engine.remove(event)
            self._deliveries.release(event)
        self._logger.warning(
            "%d inputs of the restored windows were not delivered again within %.0f s (another "
            "instance took them?): the windows go on without them",
            len(unmatched),
            self._options.window_restore_timeout_s,
        )

    def _restored(self, chunk: Chunk, now: int) -> None:
        """Every restored input is back (or given up): the windows go on."""
        self._restore_deadline = None
        self._start_clocks(now)
        held, self._held = self._held, []
        for consumer, message, arrival in held:
            topic = message.topic_name()
            self._add(chunk, consumer, message, topic, position(message.message_id()), arrival)

    def _start_clocks(self, now: int) -> None:
        self._engine.start(now)
        if self._watermarks is not None:
            self._watermarks.start(now)

    def _chunk_failed(self, chunk: Chunk) -> None:
        """A send failed: resume from the last checkpoint, with every unacknowledged input
        delivered again."""
        reason = chunk.error or next(iter(chunk.failed.values()))
        if not chunk.error:  # the acknowledger counts a failure of the whole chunk
            self._metrics.record_system_exception(reason)
        self._logger.warning(
            "a send of the windows failed (%s): resuming them from their last checkpoint",
            reason,
        )
        self._resume_requested = True
        self._inputs.rewind_requested = True
