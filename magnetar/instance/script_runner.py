"""Running a JavaScript function over a chunk of messages: one call into V8 for all of it
where the guarantees allow (see ``magnetar.instance.javascript``); each outcome is then
handled as ``PythonRunner`` handles a Python function's result. One message's failure or
timeout fails that message alone; on an ordered subscription the batch stops there and the
messages after it are handed back, to wait behind it.

A chunk's inputs are recorded as in user code (``in_flight``) while V8 has them; an input an
earlier process died with goes into V8 alone (``crashes``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from magnetar.instance.crashes import EarlierCrashes
from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.failures import FailureHandler
from magnetar.instance.in_flight import InFlightRecord
from magnetar.instance.inputs import Inputs
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.outputs import Outputs
from magnetar.instance.retries import Received
from magnetar.instance.runner import Acking
from magnetar.instance.state import JournaledState

if TYPE_CHECKING:  # V8 is loaded only by the instances of JavaScript functions
    from magnetar.instance.javascript import ScriptExecutor, ScriptOutcome, ScriptRun

__all__ = ["ScriptRunner"]

_Runnable = tuple[Any, Any, bool, bool]
"""Consumer, message, whether it was applied before (a replay), whether it runs alone."""


def _batches(runnable: list[_Runnable]) -> list[list[_Runnable]]:
    """``runnable`` cut so that each message to run alone is a batch of its own."""
    batches: list[list[_Runnable]] = [[]]
    for item in runnable:
        if item[3]:
            batches.append([item])
            batches.append([])
        else:
            batches[-1].append(item)
    return [batch for batch in batches if batch]


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
        in_flight: InFlightRecord | None = None,
        earlier_crashes: EarlierCrashes | None = None,
    ) -> None:
        """``publish_check`` raises for a topic ``context.publish`` may not reach."""
        self._in_flight = in_flight or InFlightRecord()
        self._earlier_crashes = earlier_crashes or EarlierCrashes()
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
        self._in_flight.close()

    def run(self, chunk: Chunk, received: list[Received]) -> None:
        """Process ``received`` in order as part of ``chunk``."""
        acking = self._acking
        retries = self._retries
        crashes = self._earlier_crashes
        runnable: list[_Runnable] = []
        for consumer, message in received:
            if retries.blocks(message):
                retries.hold(consumer, message)
                continue
            if acking.on_receipt:
                consumer.acknowledge(message)
            replay = acking.redeliveries is not None and acking.redeliveries.is_redelivery(
                message.topic_name(), message.message_id()
            )
            deaths = None
            if crashes and not replay:
                deaths = crashes.check(message.topic_name(), message.message_id())
                if deaths:
                    self._metrics.received += 1
                    self._failures.crashed(consumer, message, deaths, chunk)
                    continue
            runnable.append((consumer, message, replay, deaths is not None))
        batches = _batches(runnable) if crashes else [runnable]
        for number, batch in enumerate(batches):
            stopped = self._run_batch(batch, chunk)
            if stopped:  # the rest wait behind the failure
                later = [item for rest in batches[number + 1 :] for item in rest]
                self._hand_back(stopped + later)
                return

    def _run_batch(self, batch: list[_Runnable], chunk: Chunk) -> list[_Runnable]:
        """Run ``batch`` with one call into V8 (as far as it goes); what it stopped before."""
        fresh = [message for _, message, replay, _ in batch if not replay]
        in_flight = self._in_flight
        for message in fresh:
            in_flight.enter(message.topic_name(), message.message_id())
        try:
            run = self._script.process(fresh)
            for index, (consumer, message, replay, _) in enumerate(batch):
                if replay:  # applied before: acknowledged with this chunk
                    self._metrics.received += 1
                    chunk.inputs.append((consumer, message))
                    continue
                outcome = next(run, None)
                if outcome is None:
                    return batch[index:]
                self._metrics.received += 1
                self._handle(consumer, message, outcome, run, chunk)
            return []
        finally:
            in_flight.clear()

    def _hand_back(self, rest: list[_Runnable]) -> None:
        redeliveries = self._acking.redeliveries
        handed_back = []
        for consumer, message, replay, _ in rest:
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
