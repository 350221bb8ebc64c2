"""One function instance: consumer(s) -> the function -> producer, on one thread.

The hot path runs on a single Python thread: receive a chunk of messages (the consumer's
receiver queue is the bounded input queue), deserialize, call the function, serialize, send
asynchronously, and acknowledge once the chunk's sends are persisted. No per-message thread
hop, lock or Python callback. ``FunctionInstance`` is the facade over the parts:

* ``inputs``: the consumers, and the messages held back for a retry (``retries``);
* ``python_runner`` / ``script_runner``: the function over a chunk (Python, or JavaScript);
* ``failures`` and ``dead_letter``: retries with backoff and the dead-letter topic;
* ``outputs`` and ``delivery``: the producers, and sends tracked per chunk;
* ``acknowledgement``: acknowledging (or redelivering) a chunk once its sends settle;
* ``timer_runner`` (set up by ``timer_setup``): firing the due timers between chunks.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pulsar

from magnetar.instance.acknowledgement import Acknowledger
from magnetar.instance.async_runner import DEFAULT_MAX_PENDING, AsyncRunner
from magnetar.instance.config import FunctionConfig, ProcessingGuarantees, SubscriptionType
from magnetar.instance.context import InstanceContext
from magnetar.instance.crashes import EarlierCrashes
from magnetar.instance.dead_letter import DeadLetters
from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.exceptions import InstanceError, InvocationTimeoutError
from magnetar.instance.failures import FailureHandler
from magnetar.instance.in_flight import InFlightRecord
from magnetar.instance.inputs import Inputs
from magnetar.instance.invocation import Invoker
from magnetar.instance.loader import LoadedFunction, load_function
from magnetar.instance.logtopic import function_logger
from magnetar.instance.metrics import InstanceMetrics, MetricsSnapshot
from magnetar.instance.options import InstanceOptions
from magnetar.instance.outputs import Outputs, holds_batches
from magnetar.instance.positions import RedeliveryFilter
from magnetar.instance.publish_policy import check_publish_topic
from magnetar.instance.python_runner import PythonRunner
from magnetar.instance.retries import Ordering, Received, RetryQueue
from magnetar.instance.runner import Acking, Runner
from magnetar.instance.schemas import input_schema_serdes, output_schema_serde
from magnetar.instance.secrets import SecretsProvider, load_secrets_provider
from magnetar.instance.serde import SerDe, TopicSerDes, load_serde
from magnetar.instance.state import JournaledState, StateStore, UnconfiguredStateStore
from magnetar.instance.timer_runner import TimerRunner
from magnetar.instance.timer_setup import TimerPlumbing
from magnetar.instance.timer_slack import tighten_timer_slack
from magnetar.instance.windowing.extractors import load_timestamp_extractor
from magnetar.instance.windowing.runner import WindowRunner

__all__ = ["FunctionInstance", "InstanceOptions", "InvocationTimeoutError"]

log = logging.getLogger(__name__)

_PREFETCH_DRAIN_S = 1.0
_BATCH_OPEN_AT_MOST_S = 0.001
"""How long an output batch waits for more while input keeps coming (unless the user set the
batching): a steady stream keeps the instance busy, so its input is seldom all gone, and
batches would otherwise wait out their whole publish delay (10 ms). A hand-written loop's
delay; a backlog still fills batches, since a chunk of hundreds takes longer than this."""
_ORDERING = {
    SubscriptionType.SHARED: Ordering.NONE,
    SubscriptionType.KEY_SHARED: Ordering.KEY,
    SubscriptionType.FAILOVER: Ordering.ALL,
}


@dataclass(frozen=True)
class _PythonCode:
    """A Python function and how its messages are read and written."""

    function: LoadedFunction
    paths: list[Path]
    """Where its code is imported from."""
    input_serdes: dict[str, SerDe]
    """Input topic -> its SerDe (a schema's, where one is set)."""
    output_serde: SerDe
    output_schema: Any
    """The schema the output producer declares, if the output has one."""


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
        self._secrets_provider = secrets_provider
        self._on_metrics = on_metrics
        self._work_dir = work_dir
        self.metrics = InstanceMetrics(self.options.instance_id)
        self._stop = threading.Event()
        self._started = threading.Event()
        self._done = threading.Event()
        self._running = False
        self._drain = True
        self._thread: threading.Thread | None = None
        self._sender = ChunkSender(self.options.large_message_bytes, f"instance-{config.fqfn}")
        self._flush_when_idle = not holds_batches(config)
        self._chunk = Chunk()
        self._outputs: Outputs | None = None
        self._inputs: Inputs | None = None
        self._acknowledger: Acknowledger | None = None
        self._runner: Runner | None = None
        self._context: InstanceContext | None = None
        self._timers: TimerRunner | None = None
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
        tighten_timer_slack()  # before the threads the instance starts, which inherit it
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
        config, options = self.config, self.options
        guarantees = config.processing_guarantees
        at_most_once = guarantees is ProcessingGuarantees.ATMOST_ONCE
        effectively_once = guarantees is ProcessingGuarantees.EFFECTIVELY_ONCE
        redeliveries = RedeliveryFilter() if effectively_once else None
        acking = Acking(
            on_receipt=at_most_once,
            after_processing=config.acks_automatically and not at_most_once,
            redeliveries=redeliveries,
        )
        ordering = _ORDERING[config.subscription_type]
        retries = RetryQueue(
            ordering,
            config.max_message_retries,
            options.retry_delay_ms / 1000,
            options.max_retry_delay_ms / 1000,
        )
        python = None if config.is_javascript else self._load_python()
        secrets = self._secrets_provider or load_secrets_provider(
            options.secrets_provider_classname,
            options.secrets_provider_config,
            python.paths if python is not None else None,
        )
        outputs = self._outputs = Outputs(
            self._client, config, options, self._stop, python.output_schema if python else None
        )
        logger = function_logger(config, options.instance_id, outputs.producer)
        failures = FailureHandler(
            self.metrics,
            logger,
            retries,
            DeadLetters(config, self._sender, outputs.producer),
            self._journal,
            retry=not at_most_once,
            on_retry=redeliveries.retry if redeliveries is not None else None,
        )
        inputs = self._inputs = Inputs(self._client, config, options, retries, self._stop)
        self._acknowledger = Acknowledger(
            config.fqfn,
            self._sender,
            inputs,
            failures,
            self.metrics,
            self._journal,
            redeliveries.retry if redeliveries is not None else None,
        )
        if python is None:
            self._runner = self._script_runner(
                logger,
                secrets,
                inputs,
                failures,
                acking,
                stop_on_error=ordering is not Ordering.NONE,
            )
        else:
            self._runner = self._python_runner(python, logger, secrets, retries, failures, acking)
        if isinstance(self._runner, WindowRunner):
            self._runner.open()
        if self._timers is not None:
            self._timers.open()
        inputs.subscribe()

    def _python_runner(
        self,
        python: _PythonCode,
        logger: logging.Logger,
        secrets: SecretsProvider,
        retries: RetryQueue,
        failures: FailureHandler,
        acking: Acking,
    ) -> Runner:
        config, options = self.config, self.options
        assert self._outputs is not None
        context = self._context = InstanceContext(
            config,
            options.instance_id,
            self,
            self.metrics,
            self._state,
            secrets,
            logger,
            python.paths,
            options.function_version,
            self._check_publish,
        )
        window = config.window_config
        if window is not None:
            assert self._inputs is not None
            extractor = window.timestamp_extractor_class_name
            return WindowRunner(
                config,
                options,
                Invoker(python.function, context, self.metrics, config.timeout_ms),
                TopicSerDes(python.input_serdes, load_serde(None)),
                python.output_serde,
                self._outputs,
                self._sender,
                self.metrics,
                self._inputs,
                failures,
                DeadLetters(config, self._sender, self._outputs.producer),
                self._journal,
                logger,
                load_timestamp_extractor(extractor, python.paths) if extractor else None,
            )
        if inspect.iscoroutinefunction(python.function.process):
            max_pending = config.max_pending_async_requests or DEFAULT_MAX_PENDING
            return AsyncRunner(
                python.function,
                python.input_serdes,
                load_serde(None),
                python.output_serde,
                context,
                self._outputs,
                self._sender,
                self.metrics,
                retries,
                failures,
                acking,
                self,
                max_pending,
                config.timeout_ms,
                InFlightRecord(options.in_flight_path, capacity=max_pending),
                EarlierCrashes(options.earlier_crashes),
            )
        self._timers = self._timer_plumbing(logger).python(
            python.function, context, python.output_serde
        )
        return PythonRunner(
            Invoker(python.function, context, self.metrics, config.timeout_ms),
            python.input_serdes,
            load_serde(None),
            python.output_serde,
            self._outputs,
            self._sender,
            self.metrics,
            retries,
            failures,
            self._journal,
            acking,
            InFlightRecord(options.in_flight_path),
            EarlierCrashes(options.earlier_crashes),
        )

    def _timer_plumbing(self, logger: logging.Logger) -> TimerPlumbing:
        assert self._outputs is not None
        return TimerPlumbing(
            self.config,
            self.options,
            self._state,
            self._outputs,
            self._sender,
            self.metrics,
            logger,
            lambda: self._chunk,
            self._check_publish,
        )

    def _load_python(self) -> _PythonCode:
        """The Python function, the paths its code is imported from, and its SerDes."""
        config = self.config
        if self._function is None:
            if not config.py:
                raise InstanceError(f"function {config.fqfn} has no code: set py (--py)")
            self._function = load_function(
                config.py, config.class_name, self._work_dir, self.options.archive_limits
            )
        function = self._function
        paths = function.search_paths
        default = load_serde(None)
        serdes = {
            topic: load_serde(name, paths) if name else default
            for topic, name in config.input_serdes().items()
        }
        serdes.update(input_schema_serdes(config, function, paths))
        output = output_schema_serde(config, function, paths)
        return _PythonCode(
            function,
            paths,
            serdes,
            output or load_serde(config.output_serde_class_name, paths),
            output.producer_schema() if output else None,
        )

    def _script_runner(
        self,
        logger: logging.Logger,
        secrets: SecretsProvider,
        inputs: Inputs,
        failures: FailureHandler,
        acking: Acking,
        stop_on_error: bool,
    ) -> Runner:
        from magnetar.instance.javascript import open_executor, read_script
        from magnetar.instance.script_runner import ScriptRunner

        assert self._outputs is not None
        script = open_executor(
            self.config,
            self.options.instance_id,
            self._state,
            self.metrics,
            logger,
            secrets,
            stop_on_error=stop_on_error and acking.after_processing,
            url_hosts=self.options.url_hosts,
        )
        self._timers = self._timer_plumbing(logger).script(
            script, read_script(self.config.js or "")
        )
        return ScriptRunner(
            script,
            inputs,
            self._outputs,
            self._sender,
            self.metrics,
            failures,
            self._journal,
            acking,
            self._check_publish,
            InFlightRecord(self.options.in_flight_path, capacity=self.options.max_chunk),
            EarlierCrashes(self.options.earlier_crashes),
        )

    # --- the loop -----------------------------------------------------------------------

    def _loop(self) -> None:
        assert self._inputs is not None and self._acknowledger is not None
        assert self._runner is not None and self._outputs is not None
        try:
            with self._runner.timeouts():
                self._process_until_stopped(
                    self._inputs, self._acknowledger, self._runner, self._outputs
                )
                if self._drain:
                    self._process_prefetched()
                    chunk = self._chunk = Chunk()
                    self._runner.wait(chunk, self.options.drain_timeout_s)
                    self._seal(chunk)
        finally:
            if self._drain:
                self._finish_in_flight()

    def _process_until_stopped(
        self, inputs: Inputs, acknowledger: Acknowledger, runner: Runner, outputs: Outputs
    ) -> None:
        options = self.options
        next_report = time.monotonic() + options.metrics_interval_s
        windows = runner if isinstance(runner, WindowRunner) else None
        flush = self._sender.flush if self._flush_when_idle else None
        while not self._stop.is_set():
            if windows is not None:
                self._feed_windows(windows, inputs, acknowledger)
            else:
                timers = self._timers
                wake_in_s = timers.wake_in_s() if timers is not None else None
                # no more input ready: the open batches go now, not after their delay
                received = inputs.receive(
                    acknowledger.unacked > 0, runner.busy, wake_in_s, idle=flush
                )
                if received or runner.busy:
                    self._process_chunk(received)
                    if flush is not None:
                        self._sender.flush_older(_BATCH_OPEN_AT_MOST_S)
                if timers is not None and timers.due():
                    self._fire_timers(timers)
            acknowledger.acknowledge_completed()
            inputs.ask_for_stranded(acknowledger.unacked > 0 or runner.busy)
            outputs.close_idle()
            if inputs.rewind_requested:
                acknowledger.wait(options.drain_timeout_s)
                inputs.rewind(options.retry_delay_ms / 1000)
            while acknowledger.unacked > options.max_unacked and not self._stop.is_set():
                self._sender.wait_completed(0.05)
                acknowledger.acknowledge_completed()
            if time.monotonic() >= next_report:
                self._report_metrics()
                next_report = time.monotonic() + options.metrics_interval_s

    def _feed_windows(
        self, windows: WindowRunner, inputs: Inputs, acknowledger: Acknowledger
    ) -> None:
        """Windows act without input too (time windows, watermarks, retries, checkpoints):
        the wait for input ends when they are due."""
        due_in_s = windows.due_in_s()
        received: list[Received] = []
        if windows.accepts_input():
            received = inputs.receive(acknowledger.unacked > 0, wake_in_s=due_in_s)
        else:
            poll_s = self.options.poll_interval_ms / 1000
            self._stop.wait(poll_s if due_in_s is None else min(due_in_s, poll_s))
        due_in_s = windows.due_in_s()
        if received or (due_in_s is not None and due_in_s <= 0):
            self._process_chunk(received)

    def _fire_timers(self, timers: TimerRunner) -> None:
        chunk = self._chunk = Chunk()
        timers.fire_due(chunk)
        self._seal(chunk)

    def _process_chunk(self, received: list[Received]) -> None:
        assert self._acknowledger is not None and self._runner is not None
        chunk = self._chunk = Chunk()
        self._runner.run(chunk, received)
        self._seal(chunk)

    def _seal(self, chunk: Chunk) -> None:
        assert self._acknowledger is not None
        if self._journal is not None:
            self._send_journal(chunk)
        self._acknowledger.seal(chunk)

    def _send_journal(self, chunk: Chunk) -> None:
        """The chunk's state records, on the journal producer: the chunk's inputs are
        acknowledged only once they are persisted, and redelivered if they fail."""
        assert self._journal is not None and self._outputs is not None
        payloads, chunk.state = self._journal.drain()
        if payloads:
            producer = self._outputs.producer(self._journal.journal_topic)
            for payload in payloads:
                self._sender.send(chunk, producer, payload, {})

    def _process_prefetched(self) -> None:
        """On a graceful stop, also finish what the consumers already hold: handing a large
        prefetched backlog back on close can stall the subscription on pulsar-lite, and it
        would only be redelivered. Bounded, since the broker refills the queue meanwhile."""
        assert self._inputs is not None
        deadline = time.monotonic() + _PREFETCH_DRAIN_S
        budget = self.options.receiver_queue_size
        while budget > 0 and not self._inputs.rewind_requested and time.monotonic() < deadline:
            received = self._inputs.prefetched(min(budget, self.options.max_chunk))
            if not received:
                return
            self._process_chunk(received)
            budget -= len(received)

    def _finish_in_flight(self) -> None:
        if self._outputs is not None:
            self._outputs.flush()
        if self._acknowledger is None:
            return
        self._acknowledger.wait(self.options.drain_timeout_s)
        if self._timers is not None and self._timers.removals:
            # the fired timers are removed now, so a restart fires none of them again
            chunk = self._chunk = Chunk()
            self._timers.remove_settled()
            self._seal(chunk)
            self._sender.flush()
            self._acknowledger.wait(self.options.drain_timeout_s)
        if isinstance(self._runner, WindowRunner) and self._outputs is not None:
            # the checkpoint of the windows fired so far, so a restart fires none again
            chunk = self._chunk = Chunk()
            self._runner.flush(chunk)
            self._seal(chunk)
            self._outputs.flush()
            self._acknowledger.wait(self.options.drain_timeout_s)
        if self._acknowledger.unacked:
            log.warning(
                "%s: %d inputs left unacknowledged on stop; they will be redelivered",
                self.config.fqfn,
                self._acknowledger.unacked,
            )

    def _close(self) -> None:
        self._sender.close()
        if self._runner is not None:
            self._runner.close()
        if self._inputs is not None:
            self._inputs.close()
        if self._outputs is not None:
            self._outputs.close()

    def _report_metrics(self) -> None:
        if self._on_metrics is not None:
            self._on_metrics(self.snapshot())

    # --- MessagePublisher (used by the context) -----------------------------------------

    def _check_publish(self, topic: str) -> None:
        check_publish_topic(topic, self.config.tenant, self.options.publish_policy)

    def publish(
        self,
        topic: str,
        payload: bytes,
        message_conf: dict[str, Any],
        callback: Callable[[Any, Any], None] | None,
    ) -> None:
        assert self._outputs is not None and self._context is not None
        self._sender.send(
            self._chunk,
            self._outputs.producer(topic),
            payload,
            message_conf,
            callback,
            owner=self._context.message,
        )

    def ack(self, message_id: Any, topic: str) -> None:
        assert self._inputs is not None
        self._inputs.ack(message_id, topic)
