"""Running a Python function over a chunk of messages, one message at a time, on the
instance's thread (no per-message thread hop, lock or callback).

The call itself (its context, ``timeoutMs`` and latency metrics) is the ``Invoker``'s.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from magnetar.instance.crashes import EarlierCrashes
from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.failures import FailureHandler
from magnetar.instance.in_flight import InFlightRecord
from magnetar.instance.invocation import Invoker
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.outputs import Outputs
from magnetar.instance.retries import Received, RetryQueue
from magnetar.instance.runner import Acking
from magnetar.instance.serde import SerDe
from magnetar.instance.state import JournaledState
from magnetar.topics import base_topic

__all__ = ["PythonRunner"]


class PythonRunner:
    """Calls the function for each message of a chunk and handles what it returns."""

    def __init__(
        self,
        invoker: Invoker,
        input_serdes: dict[str, SerDe],
        default_serde: SerDe,
        output_serde: SerDe,
        outputs: Outputs,
        sender: ChunkSender,
        metrics: InstanceMetrics,
        retries: RetryQueue,
        failures: FailureHandler,
        journal: JournaledState | None,
        acking: Acking,
        in_flight: InFlightRecord | None = None,
        earlier_crashes: EarlierCrashes | None = None,
    ) -> None:
        """``in_flight``: where the message in user code is recorded; ``earlier_crashes``:
        messages earlier processes died with, failed on receipt."""
        self._in_flight = in_flight or InFlightRecord()
        self._earlier_crashes = earlier_crashes or EarlierCrashes()
        self._invoker = invoker
        self._input_serdes = dict(input_serdes)
        self._default_serde = default_serde
        self._output_serde = output_serde
        self._outputs = outputs
        self._sender = sender
        self._metrics = metrics
        self._retries = retries
        self._failures = failures
        self._journal = journal
        self._acking = acking

    busy = False
    """Nothing outlives a call of ``run``."""

    def wait(self, chunk: Chunk, timeout_s: float) -> None:
        """Nothing is in flight between chunks."""

    def close(self) -> None:
        self._in_flight.close()

    def timeouts(self) -> AbstractContextManager[None]:
        """Enforce ``timeoutMs`` while this context is open (only on the main thread)."""
        return self._invoker.timeouts()

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
        if self._earlier_crashes:
            deaths = self._earlier_crashes.check(topic, message_id)
            if deaths:  # (one message at a time: each runs alone)
                self._failures.crashed(consumer, message, deaths, chunk)
                return
        in_flight = self._in_flight
        in_flight.enter(topic, message_id)
        try:
            self._invoke(consumer, message, topic, message_id, chunk)
        finally:
            in_flight.leave()

    def _invoke(
        self, consumer: Any, message: Any, topic: str, message_id: Any, chunk: Chunk
    ) -> None:
        """Deserialize, call the function and handle its result (all of it user code)."""
        metrics = self._metrics
        acking = self._acking
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
        invoker = self._invoker
        invoker.context.message = message
        invoker.context.topic = topic
        try:
            result = invoker.call(value)
        except Exception as error:
            self._failures.fail(consumer, message, error, chunk)
            return
        output = self._outputs.output_for(topic)
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
