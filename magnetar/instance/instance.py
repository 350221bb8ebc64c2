"""One function instance: consumer(s) -> the function -> producer, on one thread.

The hot path runs on a single Python thread: receive a chunk of messages (the consumer's
receiver queue is the bounded input queue), deserialize, call the function, serialize,
send asynchronously, and acknowledge once the chunk's sends are persisted (see
``delivery``). No per-message thread hop, lock or Python callback.
"""

from __future__ import annotations

import base64
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import pulsar

from magnetar.instance.config import (
    FunctionConfig,
    ProcessingGuarantees,
    SubscriptionType,
)
from magnetar.instance.context import InstanceContext
from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.exceptions import InstanceError, SerDeError
from magnetar.instance.loader import LoadedFunction, load_function
from magnetar.instance.logtopic import function_logger
from magnetar.instance.metrics import InstanceMetrics, MetricsSnapshot
from magnetar.instance.positions import RedeliveryFilter, sequence_id
from magnetar.instance.secrets import EnvironmentSecretsProvider, SecretsProvider
from magnetar.instance.serde import SerDe, load_serde
from magnetar.instance.state import JournaledState, StateStore, UnconfiguredStateStore
from magnetar.instance.subscription import open_consumers
from magnetar.topics import base_topic, full_topic_name

if TYPE_CHECKING:  # V8 is loaded only by the instances of JavaScript functions
    from magnetar.instance.javascript import ScriptExecutor, ScriptOutcome, ScriptRun

__all__ = ["FunctionInstance", "InstanceOptions", "InvocationTimeoutError"]

log = logging.getLogger(__name__)

_INPUT_TOPIC = "__pfn_input_topic__"
_PREFETCH_DRAIN_S = 1.0
_INPUT_MSG_ID = "__pfn_input_msg_id__"


class InvocationTimeoutError(InstanceError):
    """The function ran longer than its ``timeoutMs``."""


@dataclass(frozen=True)
class InstanceOptions:
    """How an instance talks to the broker; defaults suit most functions."""

    instance_id: int = 0
    """Index of this instance among the function's ``parallelism`` instances."""
    receiver_queue_size: int = 1000
    """Messages prefetched per consumer: the instance's bounded input queue."""
    max_chunk: int = 500
    """Most messages processed between two acknowledgement rounds."""
    max_unacked: int = 20_000
    """Inputs processed but not yet acknowledged before the instance waits for its sends."""
    batching_max_publish_delay_ms: int = 10
    """How long the output producer waits to fill a batch."""
    large_message_bytes: int = 64 * 1024
    """Sends at least this big get a callback of their own (they can fail alone)."""
    negative_ack_redelivery_delay_ms: int = 1000
    """Delay before a failed message is redelivered."""
    poll_interval_ms: int = 100
    """Longest wait for input before the instance checks for stop and acks."""
    metrics_interval_s: float = 2.0
    """How often ``on_metrics`` receives a snapshot."""
    drain_timeout_s: float = 30.0
    """Longest wait for in-flight sends on a graceful stop."""
    send_timeout_ms: int = 30_000
    """How long a send may wait for the broker before it fails (its inputs are redelivered)."""
    worker_id: str = ""
    """The worker running this instance (reported in status)."""
    function_version: str = ""
    """Version of the function's code/config, reported by the context."""


class FunctionInstance:
    """Runs one instance of a function until stopped.

    ``run()`` processes on the calling thread (the function's ``timeoutMs`` is enforced with
    SIGALRM when that is the main thread); ``start()`` runs it on a background thread.
    """

    def __init__(
        self,
        config: FunctionConfig,
        client: pulsar.Client,
        options: InstanceOptions | None = None,
        function: LoadedFunction | None = None,
        state: StateStore | None = None,
        secrets_provider: SecretsProvider | None = None,
        on_metrics: Callable[[MetricsSnapshot], None] | None = None,
        work_dir: Path | None = None,
    ) -> None:
        self.config = config
        self.options = options or InstanceOptions()
        self._client = client
        self._function = function
        self._state = state or UnconfiguredStateStore(config.fqfn)
        # a journaled store's records go out with the chunk; without one nothing is added
        self._journal = state if isinstance(state, JournaledState) else None
        self._secrets_provider = secrets_provider or EnvironmentSecretsProvider()
        self._on_metrics = on_metrics
        self._work_dir = work_dir
        self._script: ScriptExecutor | None = None
        """The JavaScript function's executor (runtime JAVASCRIPT)."""
        self.metrics = InstanceMetrics(self.options.instance_id)
        self._stop = threading.Event()
        self._started = threading.Event()
        self._done = threading.Event()
        self._running = False
        self._thread: threading.Thread | None = None
        self._consumers: list[Any] = []
        self._consumer_by_topic: dict[str, Any] = {}
        self._producers: dict[str, Any] = {}
        self._input_serdes: dict[str, SerDe] = {}
        self._sender = ChunkSender(self.options.large_message_bytes)
        self._chunk = Chunk()
        self._unacked = 0
        self._redeliveries = RedeliveryFilter()
        self._in_invocation = False
        self._rewind = False
        self._drain = True
        self.error: BaseException | None = None

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> FunctionInstance:
        """Run on a background thread; returns once the consumers are subscribed."""
        self._thread = threading.Thread(
            target=self._run_captured, name=f"instance-{self.config.fqfn}", daemon=True
        )
        self._thread.start()
        while not self._started.wait(0.05):
            if self._done.is_set():
                assert self.error is not None
                raise self.error
        return self

    def stop(self, drain: bool = True) -> None:
        """Stop consuming; with ``drain`` in-flight messages are finished and acknowledged."""
        self._drain = drain
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the instance has stopped; False on timeout."""
        return self._done.wait(timeout)

    def _run_captured(self) -> None:
        try:
            self.run()
        except BaseException as error:
            self.error = error
            log.error("instance %s failed: %s", self.config.fqfn, error)

    def run(self) -> None:
        """Open consumers and producers, then process until ``stop()``."""
        try:
            self._open()
            self._running = True
            self._started.set()
            self._report_metrics()  # "running" is visible as soon as the consumers are ready
            self._loop()
        except BaseException as error:
            self.metrics.error = f"{type(error).__name__}: {error}"
            raise
        finally:
            self._running = False
            self._close()
            self._report_metrics()
            self._done.set()

    def snapshot(self) -> MetricsSnapshot:
        """The instance's metrics now (safe from any thread)."""
        snap = self.metrics.snapshot(self._running)
        if self.options.worker_id:
            snap = replace(snap, worker_id=self.options.worker_id)
        return snap

    # --- setup --------------------------------------------------------------------------

    def _open(self) -> None:
        config = self.config
        paths = [] if config.is_javascript else self._open_python()
        self._logger = function_logger(config, self.options.instance_id, self._producer)
        self._context = InstanceContext(
            config,
            self.options.instance_id,
            self,
            self.metrics,
            self._state,
            self._secrets_provider,
            self._logger,
            paths,
            self.options.function_version,
        )
        self._guarantees = config.processing_guarantees
        self._auto_ack = config.auto_ack and self._guarantees is not ProcessingGuarantees.MANUAL
        self._dedup = self._guarantees is ProcessingGuarantees.EFFECTIVELY_ONCE
        self._ordered = config.subscription_type is SubscriptionType.FAILOVER
        if config.is_javascript:
            from magnetar.instance.javascript import open_executor

            self._script = open_executor(
                config,
                self.options.instance_id,
                self._state,
                self.metrics,
                self._logger,
                self._secrets_provider,
                # as _process_chunk: what follows a redelivered failure waits for the rewind
                stop_on_error=self._ordered
                and self._auto_ack
                and self._guarantees is not ProcessingGuarantees.ATMOST_ONCE,
            )
        if config.output:
            self._output = self._producer(config.output)
        else:
            self._output = None
        self._subscribe()

    def _open_python(self) -> list[Path]:
        """Import the Python function and its SerDes; the paths its code is imported from."""
        config = self.config
        if self._function is None:
            if not config.py:
                raise InstanceError(f"function {config.fqfn} has no code: set py (--py)")
            self._function = load_function(config.py, config.class_name, self._work_dir)
        paths = self._function.search_paths
        self._output_serde = load_serde(config.output_serde_class_name, paths)
        self._default_serde = load_serde(None)
        for topic, serde_name in config.input_serdes().items():
            self._input_serdes[topic] = (
                load_serde(serde_name, paths) if serde_name else (self._default_serde)
            )
        return paths

    def _subscribe(self) -> None:
        self._consumers = open_consumers(
            self._client,
            self.config,
            self.options.instance_id,
            self.options.receiver_queue_size,
            self.options.negative_ack_redelivery_delay_ms,
        )
        for topic in self.config.input_serdes():
            self._consumer_by_topic[topic] = self._consumers[0]

    def _producer(self, topic: str) -> Any:
        full = full_topic_name(topic)
        producer = self._producers.get(full)
        if producer is None:
            try:
                producer = self._client.create_producer(
                    full,
                    batching_enabled=True,
                    batching_max_publish_delay_ms=self.options.batching_max_publish_delay_ms,
                    block_if_queue_full=True,
                    max_pending_messages=2 * self.options.max_unacked,
                    send_timeout_millis=self.options.send_timeout_ms,
                )
            except Exception as error:
                raise InstanceError(f"cannot create a producer on {full}: {error}") from error
            self._producers[full] = producer
        return producer

    # --- the loop -----------------------------------------------------------------------

    def _loop(self) -> None:
        next_report = time.monotonic() + self.options.metrics_interval_s
        timeout_s = (self.config.timeout_ms or 0) / 1000
        use_alarm = timeout_s > 0 and threading.current_thread() is threading.main_thread()
        previous_handler = signal.signal(signal.SIGALRM, self._on_alarm) if use_alarm else None
        self._alarm_s = timeout_s if use_alarm else 0.0
        try:
            while not self._stop.is_set():
                messages = self._receive()
                if messages:
                    self._process_chunk(messages)
                self._acknowledge_completed()
                if self._rewind:
                    self._rewind_consumers()
                while self._unacked > self.options.max_unacked and not self._stop.is_set():
                    self._sender.completed.wait(0.05)
                    self._sender.completed.clear()
                    self._acknowledge_completed()
                if time.monotonic() >= next_report:
                    self._report_metrics()
                    next_report = time.monotonic() + self.options.metrics_interval_s
        finally:
            if previous_handler is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous_handler)
            if self._drain:
                self._process_prefetched()
                self._finish_in_flight()

    def _process_prefetched(self) -> None:
        """On a graceful stop, also finish what the consumers already hold: handing a large
        prefetched backlog back on close can stall the subscription on pulsar-lite, and it
        would only be redelivered. Bounded, since the broker refills the queue meanwhile."""
        deadline = time.monotonic() + _PREFETCH_DRAIN_S
        budget = self.options.receiver_queue_size
        while budget > 0 and not self._rewind and time.monotonic() < deadline:
            messages: list[Any] = []
            for consumer in self._consumers:
                try:
                    while len(messages) < min(budget, self.options.max_chunk):
                        messages.append((consumer, consumer.receive(0)))
                except (pulsar.Timeout, pulsar.AlreadyClosed):
                    pass
            if not messages:
                return
            self._process_chunk(messages)
            budget -= len(messages)

    def _receive(self) -> list[Any]:
        """Up to ``max_chunk`` messages: wait for the first, then take what is queued."""
        poll_ms = 5 if self._unacked else self.options.poll_interval_ms
        poll_ms = max(1, poll_ms // len(self._consumers))
        messages: list[Any] = []
        limit = self.options.max_chunk
        for consumer in self._consumers:
            try:
                messages.append((consumer, consumer.receive(poll_ms)))
                while len(messages) < limit:
                    messages.append((consumer, consumer.receive(0)))
            except pulsar.Timeout:
                pass
            except pulsar.AlreadyClosed:
                if not self._stop.is_set():
                    raise
        return messages

    def _process_chunk(self, messages: list[Any]) -> None:
        if self._script is not None:
            self._process_script_chunk(messages)
            return
        chunk = self._chunk = Chunk()
        for consumer, message in messages:
            if self._rewind:
                break  # keep the order: what follows a failure comes again after the rewind
            self._process(consumer, message, chunk)
        if self._journal is not None:
            self._send_journal(chunk)
        self._unacked += len(chunk.inputs)
        self._sender.seal(chunk)

    def _process_script_chunk(self, messages: list[Any]) -> None:
        """A chunk through the JavaScript function: one call into V8 for all of it where the
        guarantees allow (see magnetar.instance.javascript); each outcome is then handled as
        ``_process`` handles a Python function's result."""
        assert self._script is not None
        chunk = self._chunk = Chunk()
        replays: set[int] = set()
        fresh: list[Any] = []
        if not self._dedup and self._guarantees is not ProcessingGuarantees.ATMOST_ONCE:
            fresh = [message for _, message in messages]
        else:
            for consumer, message in messages:
                if self._guarantees is ProcessingGuarantees.ATMOST_ONCE:
                    consumer.acknowledge(message)
                if self._dedup and self._redeliveries.is_redelivery(
                    message.topic_name(), message.message_id()
                ):
                    replays.add(id(message))
                else:
                    fresh.append(message)
        run = self._script.process(fresh)
        for consumer, message in messages:
            replay = bool(replays) and id(message) in replays
            outcome = None if replay or self._rewind else next(run, None)
            if self._rewind or (outcome is None and not replay):
                # after a failure on an ordered subscription: it comes again after the rewind
                if self._dedup and not replay:
                    self._redeliveries.retry(message.message_id())
                continue
            self.metrics.received += 1
            if outcome is None:  # applied before: acknowledged with this chunk
                chunk.inputs.append((consumer, message))
            else:
                self._handle_script_outcome(consumer, message, outcome, run, chunk)
        if self._journal is not None:
            self._send_journal(chunk)
        self._unacked += len(chunk.inputs)
        self._sender.seal(chunk)

    def _handle_script_outcome(
        self, consumer: Any, message: Any, outcome: ScriptOutcome, run: ScriptRun, chunk: Chunk
    ) -> None:
        if outcome.error is not None:
            self._fail(consumer, message, outcome.error, system=outcome.system)
            return
        if outcome.publishes:
            try:
                publishes = [
                    (self._producer(topic), payload, {"properties": props} if props else {})
                    for topic, payload, props in outcome.publishes
                ]
            except Exception as error:  # a bad topic: the function's error, as in Python
                if outcome.wrote_state:
                    run.discard()  # its updates are rolled back, but V8 went on with them
                self._fail(consumer, message, error)
                return
            for producer, payload, kwargs in publishes:
                self._sender.send(chunk, producer, payload, kwargs, owner=message)
        topic, message_id = message.topic_name(), message.message_id()
        if outcome.output is not None and self._output is not None:
            kwargs = self._output_kwargs(message, message_id, topic)
            self._sender.send(chunk, self._output, outcome.output, kwargs, owner=message)
        if outcome.ack:
            consumer.acknowledge(message)
        if self._journal is not None:
            self._journal.commit(topic, message_id)
        self.metrics.processed += 1
        if self._auto_ack and self._guarantees is not ProcessingGuarantees.ATMOST_ONCE:
            chunk.inputs.append((consumer, message))

    def _send_journal(self, chunk: Chunk) -> None:
        """The chunk's state records, on the journal producer: the chunk's inputs are
        acknowledged only once they are persisted, and redelivered if they fail."""
        assert self._journal is not None
        payloads, chunk.state = self._journal.drain()
        if payloads:
            producer = self._producer(self._journal.journal_topic)
            for payload in payloads:
                self._sender.send(chunk, producer, payload, {})

    def _process(self, consumer: Any, message: Any, chunk: Chunk) -> None:
        metrics = self.metrics
        metrics.received += 1
        topic = message.topic_name()
        message_id = message.message_id()
        if self._guarantees is ProcessingGuarantees.ATMOST_ONCE:
            consumer.acknowledge(message)
        if self._dedup and self._redeliveries.is_redelivery(topic, message_id):
            # acknowledged with this chunk, so only once everything sent before is persisted
            chunk.inputs.append((consumer, message))
            return
        serde = self._input_serdes.get(topic) or self._serde_for(topic)
        try:
            value = serde.deserialize(message.data())
        except Exception as error:
            self._fail(
                consumer,
                message,
                f"cannot deserialize message {message_id} "
                f"from {topic} with {type(serde).__name__}: {error!r}",
                system=True,
            )
            return
        context = self._context
        context.message = message
        context.topic = topic
        started = time.perf_counter()
        try:
            if self._alarm_s:
                self._in_invocation = True
                signal.setitimer(signal.ITIMER_REAL, self._alarm_s)
            if self._function.takes_context:  # type: ignore[union-attr]
                result = self._function.process(value, context)  # type: ignore[union-attr]
            else:
                result = self._function.process(value)  # type: ignore[union-attr]
        except Exception as error:
            self._fail(consumer, message, error)
            return
        finally:
            if self._alarm_s:
                self._in_invocation = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            elapsed = time.perf_counter() - started
            metrics.latency_total_s += elapsed
            metrics.latency_count += 1
            metrics.latencies_s.append(elapsed)
            metrics.last_invocation_ms = int(time.time() * 1000)
        if result is not None and self._output is not None:
            try:
                content = self._output_serde.serialize(result)
            except Exception as error:
                self._fail(consumer, message, error)
                return
            kwargs = self._output_kwargs(message, message_id, topic)
            self._sender.send(chunk, self._output, content, kwargs, owner=message)
        if self._journal is not None:
            self._journal.commit(topic, message_id)
        metrics.processed += 1
        if self._auto_ack and self._guarantees is not ProcessingGuarantees.ATMOST_ONCE:
            chunk.inputs.append((consumer, message))

    def _output_kwargs(self, message: Any, message_id: Any, topic: str) -> dict[str, Any]:
        properties = (
            dict(message.properties()) if (self.config.forward_source_message_property) else {}
        )
        properties[_INPUT_TOPIC] = topic
        properties[_INPUT_MSG_ID] = base64.b64encode(message_id.serialize()).decode()
        kwargs: dict[str, Any] = {"properties": properties}
        key = message.partition_key()
        if key:
            kwargs["partition_key"] = key
        event_time = message.event_timestamp()
        if event_time:
            kwargs["event_timestamp"] = event_time
        if self._dedup:
            kwargs["sequence_id"] = sequence_id(message_id)
        return kwargs

    def _serde_for(self, topic: str) -> SerDe:
        """The SerDe of a topic seen for the first time (a pattern match or a partition)."""
        serde = self._input_serdes.get(base_topic(topic), self._default_serde)
        self._input_serdes[topic] = serde
        return serde

    def _redeliver(self, consumer: Any, message: Any) -> None:
        """Have a failed input come again: a negative ack, or for an ordered (Failover)
        subscription a rewind, since brokers redeliver those only on reconnect."""
        if self._dedup:
            self._redeliveries.retry(message.message_id())
        if self._ordered:
            self._rewind = True
        else:
            consumer.negative_acknowledge(message)

    def _rewind_consumers(self) -> None:
        """Resubscribe, after the in-flight sends settle, so delivery resumes at the first
        unacknowledged message."""
        self._wait_for_in_flight(self.options.drain_timeout_s)
        for consumer in self._consumers:
            consumer.close()
        self._consumers.clear()
        self._stop.wait(self.options.negative_ack_redelivery_delay_ms / 1000)
        self._subscribe()
        self._rewind = False

    def _fail(
        self, consumer: Any, message: Any, error: BaseException | str, system: bool = False
    ) -> None:
        """Count a failed message and have it redelivered (or dead-lettered)."""
        if self._journal is not None:
            self._journal.rollback()  # its state updates are made again when it is retried
        if system or isinstance(error, SerDeError):
            self.metrics.record_system_exception(error)
        else:
            self.metrics.record_user_exception(error)
        self._logger.error(
            "%s processing message %s from %s: %s",
            "system error" if system else "user exception",
            message.message_id(),
            message.topic_name(),
            error,
            exc_info=error if isinstance(error, BaseException) else None,
        )
        if self._auto_ack and self._guarantees is not ProcessingGuarantees.ATMOST_ONCE:
            self._redeliver(consumer, message)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self._in_invocation:
            self._in_invocation = False
            raise InvocationTimeoutError(
                f"the function ran longer than its timeout of {self.config.timeout_ms} ms"
            )

    # --- acknowledgement ----------------------------------------------------------------

    def _acknowledge_completed(self) -> None:
        completions = self._sender.completions
        while completions:
            chunk, result, owner = completions.popleft()
            if result != pulsar.Result.Ok:
                if owner is not None:
                    chunk.failed.setdefault(id(owner), f"send failed: {result}")
                elif not chunk.error:
                    chunk.error = f"send failed: {result}"
            chunk.pending -= 1
            if chunk.pending > 0 or chunk.settled:
                continue
            chunk.settled = True
            self._unacked -= len(chunk.inputs)
            if chunk.state is not None:
                self._journal.settle(chunk.state, persisted=not chunk.error)  # type: ignore[union-attr]
            if chunk.error:
                self.metrics.record_system_exception(chunk.error)
                log.warning(
                    "%s: %d inputs will be redelivered: %s",
                    self.config.fqfn,
                    len(chunk.inputs),
                    chunk.error,
                )
                for consumer, message in chunk.inputs:
                    self._redeliver(consumer, message)
                continue
            for consumer, message in chunk.inputs:
                failure = chunk.failed.get(id(message))
                if failure is None:
                    consumer.acknowledge(message)
                    continue
                self.metrics.record_system_exception(failure)
                log.warning(
                    "%s: message %s will be redelivered: %s",
                    self.config.fqfn,
                    message.message_id(),
                    failure,
                )
                self._redeliver(consumer, message)

    def _finish_in_flight(self) -> None:
        for producer in list(self._producers.values()):
            try:
                producer.flush()
            except Exception as error:
                log.warning("flushing %s on stop failed: %s", producer.topic(), error)
        self._wait_for_in_flight(self.options.drain_timeout_s)
        if self._unacked:
            log.warning(
                "%s: %d inputs left unacknowledged on stop; they will be redelivered",
                self.config.fqfn,
                self._unacked,
            )

    def _wait_for_in_flight(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        self._acknowledge_completed()
        while self._unacked > 0 and time.monotonic() < deadline:
            self._sender.completed.wait(0.05)
            self._sender.completed.clear()
            self._acknowledge_completed()

    def _close(self) -> None:
        if self._script is not None:
            self._script.close()
        for consumer in self._consumers:
            try:
                consumer.close()
            except Exception as error:
                log.debug("closing a consumer failed: %s", error)
        for producer in self._producers.values():
            try:
                producer.close()
            except Exception as error:
                log.debug("closing a producer failed: %s", error)
        self._consumers.clear()
        self._producers.clear()

    def _report_metrics(self) -> None:
        if self._on_metrics is not None:
            self._on_metrics(self.snapshot())

    # --- MessagePublisher (used by the context) -----------------------------------------

    def publish(
        self,
        topic: str,
        payload: bytes,
        message_conf: dict[str, Any],
        callback: Callable[[Any, Any], None] | None,
    ) -> None:
        self._sender.send(
            self._chunk,
            self._producer(topic),
            payload,
            message_conf,
            callback,
            owner=self._context.message,
        )

    def ack(self, message_id: Any, topic: str) -> None:
        consumer = self._consumer_by_topic.get(topic) or self._consumers[0]
        consumer.acknowledge(message_id)
