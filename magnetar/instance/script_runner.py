"""Running a JavaScript function over a chunk of messages: one call into V8 for all of it
where the guarantees allow (see ``magnetar.instance.javascript``); each outcome is then
handled as ``PythonRunner`` handles a Python function's result. One message's failure or
timeout fails that message alone; on an ordered subscription the batch stops there and the
messages after it are handed back, to wait behind it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.failures import FailureHandler
from magnetar.instance.inputs import Inputs
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.outputs import Outputs
from magnetar.instance.retries import Received
from magnetar.instance.runner import Acking
from magnetar.instance.state import JournaledState

if TYPE_CHECKING:  # V8 is loaded only by the instances of JavaScript functions
    from magnetar.instance.javascript import ScriptExecutor, ScriptOutcome, ScriptRun

__all__ = ["ScriptRunner"]


class ScriptRunner:
    """Feeds chunks to the script's executor and handles the outcomes."""

    def __init__(
        self,
        script: ScriptExecutor,
        inputs: Inputs,
        outputs: Outputs,
        sender: ChunkSender,
        metrics: InstanceMetrics,
        failures: FailureHandler,
        journal: JournaledState | None,
        acking: Acking,
        publish_check: Callable[[str], None],
    ) -> None:
        """``publish_check`` raises for a topic ``context.publish`` may not reach."""
        self._script = script
        self._publish_check = publish_check
        self._inputs = inputs
        self._retries = inputs.retries
        self._outputs = outputs
        self._sender = sender
        self._metrics = metrics
        self._failures = failures
        self._journal = journal
        self._acking = acking

    busy = False
    """Nothing outlives a call of ``run``."""

    def timeouts(self) -> AbstractContextManager[None]:
        """V8 holds each call to ``timeoutMs`` itself."""
        return nullcontext()

    def wait(self, chunk: Chunk, timeout_s: float) -> None:
        """Nothing is in flight between chunks."""

    def close(self) -> None:
        self._script.close()

    def run(self, chunk: Chunk, received: list[Received]) -> None:
        """Process ``received`` in order as part of ``chunk``."""
        acking = self._acking
        retries = self._retries
        runnable: list[tuple[Any, Any, bool]] = []
        """(consumer, message, applied before) in order."""
        for consumer, message in received:
            if retries.blocks(message):
                retries.hold(consumer, message)
                continue
            if acking.on_receipt:
                consumer.acknowledge(message)
            replay = acking.redeliveries is not None and acking.redeliveries.is_redelivery(
                message.topic_name(), message.message_id()
            )
            runnable.append((consumer, message, replay))
        run = self._script.process([message for _, message, replay in runnable if not replay])
        for index, (consumer, message, replay) in enumerate(runnable):
            if replay:  # applied before: acknowledged with this chunk
                self._metrics.received += 1
                chunk.inputs.append((consumer, message))
                continue
            outcome = next(run, None)
            if outcome is None:  # stopped at a failure: the rest wait behind it
                self._hand_back(runnable[index:])
                return
            self._metrics.received += 1
            self._handle(consumer, message, outcome, run, chunk)

    def _hand_back(self, rest: list[tuple[Any, Any, bool]]) -> None:
        redeliveries = self._acking.redeliveries
        handed_back = []
        for consumer, message, replay in rest:
            if replay:
                continue
            if redeliveries is not None:
                redeliveries.retry(message.message_id())
            handed_back.append((consumer, message))
        self._inputs.hand_back(handed_back)

    def _handle(
        self, consumer: Any, message: Any, outcome: ScriptOutcome, run: ScriptRun, chunk: Chunk
    ) -> None:
        if outcome.error is not None:
            self._failures.fail(consumer, message, outcome.error, chunk, system=outcome.system)
            return
        if outcome.publishes:
            try:
                for topic, _, _ in outcome.publishes:
                    self._publish_check(topic)
                publishes = [
                    (self._outputs.producer(topic), payload, {"properties": props} if props else {})
                    for topic, payload, props in outcome.publishes
                ]
            except Exception as error:  # a bad topic: the function's error, as in Python
                if outcome.wrote_state:
                    run.discard()  # its updates are rolled back, but V8 went on with them
                self._failures.fail(consumer, message, error, chunk)
                return
            for producer, payload, kwargs in publishes:
                self._sender.send(chunk, producer, payload, kwargs, owner=message)
        topic, message_id = message.topic_name(), message.message_id()
        output = self._outputs.output_for(topic)
        if outcome.output is not None and output is not None:
            kwargs = self._outputs.result_kwargs(message, message_id, topic)
            self._sender.send(chunk, output, outcome.output, kwargs, owner=message)
        if outcome.ack:
            consumer.acknowledge(message)
        if self._journal is not None:
            self._journal.commit(topic, message_id)
        self._metrics.processed += 1
        if self._acking.after_processing:
            chunk.inputs.append((consumer, message))
        else:  # its failures are forgotten when it is acknowledged
            self._retries.succeeded(message)
