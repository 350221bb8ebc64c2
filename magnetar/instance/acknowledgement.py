"""Acknowledging a chunk's inputs once its sends are persisted (see ``delivery``).

When a send fails for the whole chunk (a timeout, a lost connection) its inputs are delivered
again by the broker: that is not the function's failure. When a send of one input's fails on
its own (a result too large for the broker), that input failed, as if its result could not be
serialized: it is retried and, its retries used up, dead-lettered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pulsar

from magnetar.instance.delivery import Chunk, ChunkSender
from magnetar.instance.failures import FailureHandler
from magnetar.instance.inputs import Inputs
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.state import JournaledState

__all__ = ["Acknowledger"]

log = logging.getLogger(__name__)


class Acknowledger:
    """Settles sealed chunks as their send callbacks arrive (on the instance's thread)."""

    def __init__(
        self,
        fqfn: str,
        sender: ChunkSender,
        inputs: Inputs,
        failures: FailureHandler,
        metrics: InstanceMetrics,
        journal: JournaledState | None,
        redelivered: Callable[[Any], None] | None = None,
    ) -> None:
        """``redelivered(message_id)`` is told of each input the broker will deliver again."""
        self._fqfn = fqfn
        self._sender = sender
        self._inputs = inputs
        self._retries = inputs.retries
        self._failures = failures
        self._metrics = metrics
        self._journal = journal
        self._redelivered = redelivered
        self.unacked = 0
        """Inputs of sealed chunks not yet acknowledged (or redelivered)."""

    def seal(self, chunk: Chunk) -> None:
        """The chunk is complete: its last sends go out with their callbacks."""
        self.unacked += len(chunk.inputs)
        self._sender.seal(chunk)

    def acknowledge_completed(self) -> None:
        """Settle every chunk whose sends have all completed."""
        completions = self._sender.collect()
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
            self.unacked -= len(chunk.inputs)
            if chunk.state is not None:
                assert self._journal is not None
                self._journal.settle(chunk.state, persisted=not chunk.error)
            self._settle(chunk)
            if chunk.on_settled is not None:
                chunk.on_settled(chunk)

    def _settle(self, chunk: Chunk) -> None:
        if chunk.error:
            self._metrics.record_system_exception(chunk.error)
            log.warning(
                "%s: %d inputs will be redelivered: %s",
                self._fqfn,
                len(chunk.inputs),
                chunk.error,
            )
            for consumer, message in chunk.inputs:
                self._redeliver(consumer, message)
            return
        retried = Chunk()
        for consumer, message in chunk.inputs:
            failure = chunk.failed.get(id(message))
            if failure is None:
                consumer.acknowledge(message)
                self._retries.succeeded(message)
            else:
                self._failures.fail(consumer, message, failure, retried, system=True)
        if retried.inputs or retried.pending:  # dead letters: acknowledged once stored
            self.seal(retried)

    def _redeliver(self, consumer: Any, message: Any) -> None:
        if self._redelivered is not None:
            self._redelivered(message.message_id())
        self._inputs.redeliver(consumer, message)

    def wait(self, timeout_s: float) -> None:
        """Settle chunks until none is in flight, or ``timeout_s`` has passed."""
        deadline = time.monotonic() + timeout_s
        self.acknowledge_completed()
        while self.unacked > 0 and time.monotonic() < deadline:
            self._sender.wait_completed(0.05)
            self.acknowledge_completed()
