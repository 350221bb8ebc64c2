"""A state replicated through one system topic: every worker replays it in order with a
``TopicTailer`` (``magnetar.tailer``); the leader appends to it. Records are sealed with the
cluster key, and one without a valid seal is dropped before it is applied
(``magnetar.worker.cluster_key``)."""

from __future__ import annotations

import logging
from typing import Any

import pulsar

from magnetar.tailer import TopicTailer
from magnetar.worker.cluster_key import RecordSeal
from magnetar.worker.exceptions import ReplicationTimeoutError

__all__ = ["ReplicatedState"]

log = logging.getLogger(__name__)


class ReplicatedState:
    """Base of a state replicated through one topic: every worker replays it with
    ``_apply``; the leader appends with ``_publish``, which returns once applied here."""

    def __init__(
        self, client: pulsar.Client, topic: str, name: str, seal: RecordSeal | None
    ) -> None:
        """``seal``: the cluster's; None writes and accepts unsealed records."""
        self._client = client
        self._topic = topic
        self._name = name
        self._seal = seal or RecordSeal(None)
        self._tailer = TopicTailer(client, topic, self._receive, name)
        self._producer: Any = None

    def start(self) -> None:
        self._tailer.start()

    def stop(self) -> None:
        self._tailer.stop()
        if self._producer is not None:
            try:
                self._producer.close()
            except Exception as error:
                log.debug("closing the %s producer failed: %s", self._name, error)

    def wait_caught_up(self, timeout: float) -> bool:
        """Wait until the replay has reached where the topic ended at start."""
        return self._tailer.wait_caught_up(timeout)

    def catch_up(self, timeout: float) -> bool:
        """Wait until everything published so far is applied (a new leader's view)."""
        return self._tailer.catch_up(timeout)

    def _publish(self, value: bytes, properties: dict[str, str], timeout: float) -> None:
        if self._producer is None:
            self._producer = self._client.create_producer(self._topic, batching_enabled=False)
        sealed = self._seal.seal(self._name, value, properties)
        message_id = self._producer.send(value, properties=sealed)
        if not self._tailer.wait_applied(message_id, timeout):
            raise ReplicationTimeoutError(
                f"the {self._name} write was not applied within {timeout:.0f}s"
            )

    def _receive(self, message: Any) -> None:
        if self._seal.accepts(self._name, self._topic, message):
            self._apply(message)

    def _apply(self, message: Any) -> None:
        """Apply one record that a worker of this cluster wrote."""
        raise NotImplementedError
