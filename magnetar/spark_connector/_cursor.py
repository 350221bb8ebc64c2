"""The subscriptions a streaming query keeps at its progress (StreamNative's "cursor").

StreamNative's source keeps one subscription per topic partition, named
``predefinedSubscription`` or ``<subscriptionPrefix>-<partition>``, and moves it to each
committed offset: the broker's retention then keeps what the query has not processed yet.
A subscription it created is deleted when the query stops; a predefined one is kept.

The offsets themselves live in Spark's checkpoint; these subscriptions only mark progress
for the broker. The connector moves them by a cumulative acknowledgement up to the last
whole entry read (seek is unreliable on pulsar-lite), through Failover consumers that
prefetch nothing, so a consumer left behind by a crashed driver does not lock the
subscription.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

import pulsar

from magnetar.spark_connector._offsets import BEFORE_EARLIEST, ENTRY_END, Position

__all__ = ["ProgressCursor"]

log = logging.getLogger(__name__)


class ProgressCursor:
    """One streaming query's progress subscriptions, on the driver."""

    def __init__(self, client: pulsar.Client, predefined: str | None, prefix: str | None) -> None:
        self._client = client
        self._predefined = predefined
        self._prefix = prefix or f"spark-pulsar-{uuid.uuid4()}"
        self._consumers: dict[str, Any] = {}

    def subscription(self, partition: str) -> str:
        """The subscription name kept on ``partition``."""
        return self._predefined or f"{self._prefix}-{partition}"

    def commit(self, offsets: Mapping[str, Position]) -> None:
        """Move each partition's subscription to its offset (the last message processed)."""
        for partition, position in offsets.items():
            consumer = self._consumer(partition)
            ledger, entry, batch = position
            if position == BEFORE_EARLIEST:
                continue
            # Acknowledging inside a batch is not possible without its messages: stop at the
            # last whole entry, which keeps at most one entry more than needed.
            if batch not in (-1, ENTRY_END):
                entry -= 1
            if entry < 0:
                continue
            try:
                consumer.acknowledge_cumulative(pulsar.MessageId(-1, ledger, entry, -1))
            except pulsar.PulsarException as error:
                log.warning(
                    "cannot move subscription %s on %s: %s",
                    self.subscription(partition),
                    partition,
                    error,
                )

    def close(self) -> None:
        """Delete the subscriptions this query created; keep a predefined one."""
        for partition, consumer in self._consumers.items():
            try:
                if self._predefined is None:
                    consumer.unsubscribe()
                else:
                    consumer.close()
            except pulsar.PulsarException as error:
                log.warning(
                    "cannot remove subscription %s on %s: %s",
                    self.subscription(partition),
                    partition,
                    error,
                )
        self._consumers.clear()

    def _consumer(self, partition: str) -> Any:
        consumer = self._consumers.get(partition)
        if consumer is None:
            consumer = self._consumers[partition] = self._client.subscribe(
                partition,
                self.subscription(partition),
                consumer_type=pulsar.ConsumerType.Failover,
                receiver_queue_size=0,
                initial_position=pulsar.InitialPosition.Earliest,
            )
        return consumer

    def open(self, partitions: list[str]) -> None:
        """Create (or join) the subscriptions of ``partitions`` now, so retention keeps their
        messages from the query's start."""
        for partition in partitions:
            self._consumer(partition)
