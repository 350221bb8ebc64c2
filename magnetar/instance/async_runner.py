"""Running an ``async def process`` concurrently: up to ``maxPendingAsyncRequests``
invocations in flight on an event loop that the instance's own thread drives between receives
(no thread hop per message), their results handled in input order, so outputs keep the input
order and an input is acknowledged only once its output is persisted, as for a plain
function.

Each invocation has a context of its own; its ``publish`` calls are sent, in order, when its
result is handled, and state is not available to it (the state journal records one input's
updates at a time). On an ordered subscription, a result that would overtake a failing input is
dropped and its input waits behind the failing one, to run again after it.

Every pending invocation's input is recorded as in user code (``in_flight``) until its result
is handled; an input an earlier process died with runs with no other invocation pending
(``crashes``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from magnetar.instance.context import InstanceContext
from magnetar.instance.crashes import EarlierCrashes
from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.exceptions import InvocationTimeoutError
from magnetar.instance.failures import FailureHandler
from magnetar.instance.in_flight import MAX_IN_FLIGHT, InFlightRecord
from magnetar.instance.loader import LoadedFunction
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.outputs import Outputs
from magnetar.instance.retries import Received, RetryQueue
from magnetar.instance.runner import Acking
from magnetar.instance.serde import SerDe
from magnetar.instance.state import UnconfiguredStateStore
from magnetar.topics import base_topic

__all__ = ["DEFAULT_MAX_PENDING", "AsyncRunner"]

DEFAULT_MAX_PENDING = 1000
"""Pulsar's default ``maxPendingAsyncRequests``."""


@dataclass
class _Publishes:
    """What one invocation published, sent when its result is handled."""

    sends: list[tuple[str, bytes, dict[str, Any], Callable[[Any, Any], None] | None]] = field(
        default_factory=list
    )
    acks: list[tuple[Any, str]] = field(default_factory=list)

    def publish(
        self,
        topic: str,
        payload: bytes,
        message_conf: dict[str, Any],
        callback: Callable[[Any, Any], None] | None,
    ) -> None:
        self.sends.append((topic, payload, message_conf, callback))

    def ack(self, message_id: Any, topic: str) -> None:
        self.acks.append((message_id, topic))


_NO_STATE = (
    "state is not available to an async process: the journal records the updates of one input "
    "at a time; keep state in a plain (def) process"
)

_SLICE_S = 0.005
"""How long the loop runs between two receives while invocations are in flight."""


@dataclass
class _Invocation:
    consumer: Any
    message: Any
    task: asyncio.Task[Any]
    publishes: _Publishes
    started: float


class AsyncRunner:
    """Feeds messages to an async function and handles its results in order."""

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
        acking: Acking,
        publisher: Any,
        max_pending: int,
        timeout_ms: int | None,
        in_flight: InFlightRecord | None = None,
        earlier_crashes: EarlierCrashes | None = None,
    ) -> None:
        """``max_pending`` is held to ``MAX_IN_FLIGHT``, the most an in-flight record holds."""
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
        self._acking = acking
        self._publisher = publisher
        self._max_pending = min(max_pending, MAX_IN_FLIGHT)
        self._in_flight = in_flight or InFlightRecord()
        self._earlier_crashes = earlier_crashes or EarlierCrashes()
        self._timeout_s = (timeout_ms or 0) / 1000
        self._pending: deque[_Invocation] = deque()
        self._no_state = UnconfiguredStateStore(context.get_function_id(), reason=_NO_STATE)
        self._loop = asyncio.new_event_loop()

    @property
    def busy(self) -> bool:
        """Invocations are in flight."""
        return bool(self._pending)

    def timeouts(self) -> AbstractContextManager[None]:
        """Each invocation is held to ``timeoutMs`` on the event loop."""
        return nullcontext()

    def run(self, chunk: Chunk, received: list[Received]) -> None:
        """Start ``received`` (in order), let the invocations run a moment, and handle every
        result that is ready, in order."""
        for consumer, message in received:
            if self._retries.blocks(message):
                self._retries.hold(consumer, message)
                continue
            while len(self._pending) >= self._max_pending:
                # full: the oldest must finish first, and frees one place only, so that the
                # invocations start (and finish) one after the other, not in bursts
                if not self._pending[0].task.done():
                    self._drive(until_head=True)
                self._handle(self._pending.popleft(), chunk)
            if self._start(consumer, message, chunk):
                self._drive(until_head=True)  # alone: done before the next one starts
                self._handle(self._pending.popleft(), chunk)
            else:
                self._tick()
        if self._pending:
            self._drive(until_head=False)
        self._collect(chunk)

    def wait(self, chunk: Chunk, timeout_s: float | None) -> None:
        """Handle results until none is in flight or ``timeout_s`` passed (None: however
        long it takes): on stop, and before an input that is to run alone."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._pending and (deadline is None or time.monotonic() < deadline):
            self._drive(until_head=True, timeout_s=deadline and deadline - time.monotonic())
            self._collect(chunk)

    def close(self) -> None:
        for invocation in self._pending:
            invocation.task.cancel()
        if self._pending:
            self._loop.run_until_complete(
                asyncio.gather(*(i.task for i in self._pending), return_exceptions=True)
            )
        self._loop.close()
        self._in_flight.clear()  # cancelled: none of them killed the process
        self._in_flight.close()

    def _drive(self, until_head: bool, timeout_s: float | None = None) -> None:
        """Run the event loop: until the oldest invocation is done, or for a short slice (or
        until one finishes, if sooner)."""
        head = self._pending[0].task
        if until_head:
            waiter = asyncio.wait([head], timeout=timeout_s)
        else:
            waiter = asyncio.wait(
                [i.task for i in self._pending],
                timeout=_SLICE_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
        self._loop.run_until_complete(waiter)

    def _tick(self) -> None:
        """One turn of the event loop: a new invocation runs up to its first await now (its
        service call starts) rather than when the loop next runs."""
        self._loop.call_soon(self._loop.stop)
        self._loop.run_forever()

    def _start(self, consumer: Any, message: Any, chunk: Chunk) -> bool:
        """Start an invocation for ``message`` (if it is to run); whether it runs alone."""
        self._metrics.received += 1
        topic = message.topic_name()
        acking = self._acking
        if acking.on_receipt:
            consumer.acknowledge(message)
        if acking.redeliveries is not None and acking.redeliveries.is_redelivery(
            topic, message.message_id()
        ):
            chunk.inputs.append((consumer, message))
            return False
        alone = False
        if self._earlier_crashes:
            deaths = self._earlier_crashes.check(topic, message.message_id())
            if deaths:
                self._failures.crashed(consumer, message, deaths, chunk)
                return False
            if deaths is not None:
                self.wait(chunk, None)
                alone = True
        serde = self._input_serdes.get(topic) or self._serde_for(topic)
        self._in_flight.enter(topic, message.message_id())
        try:
            value = serde.deserialize(message.data())
        except Exception as error:
            self._in_flight.leave_newest()
            self._failures.fail(
                consumer,
                message,
                f"cannot deserialize message {message.message_id()} from {topic} with "
                f"{type(serde).__name__}: {error!r}",
                chunk,
                system=True,
            )
            return False
        publishes = _Publishes()
        context = self._context.for_invocation(message, topic, publishes, self._no_state)
        call = (
            self._function.process(value, context)
            if self._function.takes_context
            else self._function.process(value)
        )
        if self._timeout_s:
            call = asyncio.wait_for(call, self._timeout_s)
        task = self._loop.create_task(call)
        self._pending.append(_Invocation(consumer, message, task, publishes, time.perf_counter()))
        return alone

    def _collect(self, chunk: Chunk) -> None:
        pending = self._pending
        while pending and pending[0].task.done():
            self._handle(pending.popleft(), chunk)

    def _handle(self, invocation: _Invocation, chunk: Chunk) -> None:
        self._in_flight.leave()
        consumer, message = invocation.consumer, invocation.message
        metrics = self._metrics
        elapsed = time.perf_counter() - invocation.started
        metrics.latency_total_s += elapsed
        metrics.latency_count += 1
        metrics.latencies_s.append(elapsed)
        metrics.last_invocation_ms = int(time.time() * 1000)
        if self._retries.blocks(message):  # behind a failed input: runs again after it
            metrics.received -= 1
            if self._acking.redeliveries is not None:
                self._acking.redeliveries.retry(message.message_id())
            self._retries.hold(consumer, message)
            return
        error = invocation.task.exception()
        if isinstance(error, TimeoutError):
            error = InvocationTimeoutError(
                f"the function ran longer than its timeout of {int(self._timeout_s * 1000)} ms"
            )
        if error is not None:
            self._failures.fail(consumer, message, error, chunk)
            return
        result = invocation.task.result()
        topic, message_id = message.topic_name(), message.message_id()
        output = self._outputs.output_for(topic)
        if result is not None and output is not None:
            try:
                content = self._output_serde.serialize(result)
            except Exception as failure:
                self._failures.fail(consumer, message, failure, chunk)
                return
            kwargs = self._outputs.result_kwargs(message, message_id, topic)
            self._sender.send(chunk, output, content, kwargs, owner=message)
        for target, payload, conf, callback in invocation.publishes.sends:
            self._sender.send(
                chunk, self._outputs.producer(target), payload, conf, callback, owner=message
            )
        for acked, acked_topic in invocation.publishes.acks:
            self._publisher.ack(acked, acked_topic)
        metrics.processed += 1
        if self._acking.after_processing:
            chunk.inputs.append((consumer, message))
        else:
            self._retries.succeeded(message)

    def _serde_for(self, topic: str) -> SerDe:
        serde = self._input_serdes.get(base_topic(topic), self._default_serde)
        self._input_serdes[topic] = serde
        return serde
