"""Running a Python function over a chunk of messages, one message at a time, on the
instance's thread (no per-message thread hop, lock or callback); ``invocation`` calls it
within its ``timeoutMs``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.failures import FailureHandler
from magnetar.instance.invocation import Invoker
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.outputs import Outputs
from magnetar.instance.positions import RedeliveryFilter
from magnetar.instance.retries import Received, RetryQueue
from magnetar.instance.serde import SerDe, TopicSerDes
from magnetar.instance.state import JournaledState

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
        invoker: Invoker,
        input_serdes: TopicSerDes,
        output_serde: SerDe,
        outputs: Outputs,
        sender: ChunkSender,
        metrics: InstanceMetrics,
        retries: RetryQueue,
        failures: FailureHandler,
        journal: JournaledState | None,
        acking: Acking,
    ) -> None:
        self._invoker = invoker
        self._context = invoker.context
        self._input_serdes = input_serdes
        self._output_serde = output_serde
        self._outputs = outputs
        self._sender = sender
        self._metrics = metrics
        self._retries = retries
        self._failures = failures
        self._journal = journal
        self._acking = acking

    @contextmanager
    def timeouts(self) -> Iterator[None]:
        """Enforce ``timeoutMs`` while this context is open (only on the main thread)."""
        with self._invoker.timeouts():
            yield

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
        serde = self._input_serdes[topic]
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
        try:
            result = self._invoker.call(value)
        except Exception as error:
            self._failures.fail(consumer, message, error, chunk)
            return
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
