"""Running a Python function over a chunk of messages, one message at a time, on the
instance's thread (no per-message thread hop, lock or callback).

The function's ``timeoutMs`` is enforced with SIGALRM when the instance runs on the main
thread (its own process, as in localrun and the worker's process runtime).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

from magnetar.instance.context import InstanceContext
from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.exceptions import InvocationTimeoutError
from magnetar.instance.failures import FailureHandler
from magnetar.instance.loader import LoadedFunction
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.outputs import Outputs
from magnetar.instance.positions import RedeliveryFilter
from magnetar.instance.retries import Received, RetryQueue
from magnetar.instance.serde import SerDe
from magnetar.instance.state import JournaledState
from magnetar.topics import base_topic

__all__ = ["Acking", "PythonRunner"]


@dataclass(frozen=True)
class Acking:
    """When inputs are acknowledged, from the processing guarantees."""

    on_receipt: bool
    """ATMOST_ONCE: on receipt, before processing."""
    after_processing: bool
    """ATLEAST_ONCE and EFFECTIVELY_ONCE with autoAck: once the outputs are persisted."""
    redeliveries: RedeliveryFilter | None
    """EFFECTIVELY_ONCE: skips inputs applied before."""


class PythonRunner:
    """Calls the function for each message of a chunk and handles what it returns."""

    def __init__(
        self,
        function: LoadedFunction,
        input_serdes: dict[str, SerDe],
        default_serde: SerDe,
        output_serde: SerDe,
        context: InstanceContext,
        outputs: Outputs,
        sender: ChunkSender,
        metrics: InstanceMetrics,
        retries: RetryQueue,
        failures: FailureHandler,
        journal: JournaledState | None,
        acking: Acking,
        timeout_ms: int | None,
    ) -> None:
        self._function = function
        self._input_serdes = dict(input_serdes)
        self._default_serde = default_serde
        self._output_serde = output_serde
        self._context = context
        self._outputs = outputs
        self._sender = sender
        self._metrics = metrics
        self._retries = retries
        self._failures = failures
        self._journal = journal
        self._acking = acking
        self._timeout_ms = timeout_ms
        self._alarm_s = 0.0
        self._in_invocation = False

    @contextmanager
    def timeouts(self) -> Iterator[None]:
        """Enforce ``timeoutMs`` while this context is open (only on the main thread)."""
        timeout_s = (self._timeout_ms or 0) / 1000
        if timeout_s <= 0 or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGALRM, self._on_alarm)
        self._alarm_s = timeout_s
        try:
            yield
        finally:
            self._alarm_s = 0.0
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def run(self, chunk: Chunk, received: list[Received]) -> None:
        """Process ``received`` in order as part of ``chunk``."""
        retries = self._retries
        for consumer, message in received:
            if retries.blocks(message):
                retries.hold(consumer, message)
            else:
                self._process(consumer, message, chunk)

    def _process(self, consumer: Any, message: Any, chunk: Chunk) -> None:
        metrics = self._metrics
        metrics.received += 1
        topic = message.topic_name()
        message_id = message.message_id()
        acking = self._acking
        if acking.on_receipt:
            consumer.acknowledge(message)
        if acking.redeliveries is not None and acking.redeliveries.is_redelivery(topic, message_id):
            # acknowledged with this chunk, so only once everything sent before is persisted
            chunk.inputs.append((consumer, message))
            return
        serde = self._input_serdes.get(topic) or self._serde_for(topic)
        try:
            value = serde.deserialize(message.data())
        except Exception as error:
            self._failures.fail(
                consumer,
                message,
                f"cannot deserialize message {message_id} "
                f"from {topic} with {type(serde).__name__}: {error!r}",
                chunk,
                system=True,
            )
            return
        context = self._context
        context.message = message
        context.topic = topic
        function = self._function
        started = time.perf_counter()
        try:
            if self._alarm_s:
                self._in_invocation = True
                signal.setitimer(signal.ITIMER_REAL, self._alarm_s)
            if function.takes_context:
                result = function.process(value, context)
            else:
                result = function.process(value)
        except Exception as error:
            self._failures.fail(consumer, message, error, chunk)
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
        output = self._outputs.output
        if result is not None and output is not None:
            try:
                content = self._output_serde.serialize(result)
            except Exception as error:
                self._failures.fail(consumer, message, error, chunk)
                return
            kwargs = self._outputs.result_kwargs(message, message_id, topic)
            self._sender.send(chunk, output, content, kwargs, owner=message)
        if self._journal is not None:
            self._journal.commit(topic, message_id)
        metrics.processed += 1
        if acking.after_processing:
            chunk.inputs.append((consumer, message))
        else:  # its failures are forgotten when it is acknowledged
            self._retries.succeeded(message)

    def _serde_for(self, topic: str) -> SerDe:
        """The SerDe of a topic seen for the first time (a pattern match or a partition)."""
        serde = self._input_serdes.get(base_topic(topic), self._default_serde)
        self._input_serdes[topic] = serde
        return serde

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        if self._in_invocation:
            self._in_invocation = False
            raise InvocationTimeoutError(
                f"the function ran longer than its timeout of {self._timeout_ms} ms"
            )
