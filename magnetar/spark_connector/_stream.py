"""Structured Streaming: offsets are the last message id read per topic partition.

A micro-batch reads ``(start, end]`` of every topic partition, so a query restarted from its
checkpoint reads exactly what follows its last committed offsets. The driver-side reader
lives in one long-lived Python process per query, so it keeps its client there; with
``maxRecordsPerTrigger`` it reads ahead from each start to find where the batch ends.

Spark keeps no record of a query's initial offset: a query stopped before its first batch
committed asks ``initialOffset()`` again when restarted, so ``startingOffsets=latest`` then
means the latest message at the restart.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pulsar
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from magnetar.spark_connector._batch import read_batches, read_settings
from magnetar.spark_connector._client import last_position, open_client, topic_partitions
from magnetar.spark_connector._offsets import (
    BEFORE_EARLIEST,
    Position,
    decode_offset,
    encode_offset,
    position_of,
)
from magnetar.spark_connector._options import EARLIEST, SourceOptions
from magnetar.spark_connector._ranges import RangePartition, read_range

try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # PySpark < 4.2: no read limits, and latestOffset() gets no arguments
    from magnetar.spark_connector._compat import (  # type: ignore[assignment]
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

__all__ = ["PulsarStreamReader"]


class PulsarStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("pulsar")``."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._settings = read_settings(options)
        self._client: pulsar.Client | None = None
        self._initial: dict[str, list[int]] | None = None
        self._target: dict[str, Position] | None = None

    # --- driver -------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, list[int]]:
        # Spark asks more than once; "latest" must mean the same moment every time.
        if self._initial is None:
            starting = self._options.starting
            positions: dict[str, Position] = {}
            for partition in self._partitions():
                if starting == EARLIEST:
                    positions[partition] = BEFORE_EARLIEST
                elif isinstance(starting, dict) and partition in starting:
                    positions[partition] = starting[partition]
                else:
                    positions[partition] = last_position(self._driver_client(), partition)
            self._initial = encode_offset(positions)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._options.max_records_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, list[int]]:
        latest = self._latest() if self._target is None else self._target
        if start is None:
            return encode_offset(latest)
        begin = decode_offset(start)
        end = dict(begin)
        for partition, position in latest.items():
            # After a restart the checkpoint may be past what the broker reports: never go back.
            end[partition] = max(position, begin.get(partition, BEFORE_EARLIEST))
        if isinstance(limit, ReadMaxRows):
            begun = {p: begin.get(p, BEFORE_EARLIEST) for p in latest}
            end = {**end, **self._advance(begun, latest, limit.max_rows)}
        return encode_offset(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[RangePartition]:
        begin, finish = decode_offset(start), decode_offset(end)
        return [
            RangePartition(topic, begin.get(topic, BEFORE_EARLIEST), position)
            for topic, position in sorted(finish.items())
            if position > begin.get(topic, BEFORE_EARLIEST)
        ]

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not on the broker."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _driver_client(self) -> pulsar.Client:
        if self._client is None:
            self._client = open_client(self._options.service_url, self._options.client_conf)
        return self._client

    def _partitions(self) -> list[str]:
        client = self._driver_client()
        return sorted(p for topic in self._options.topics for p in topic_partitions(client, topic))

    def _latest(self) -> dict[str, Position]:
        client = self._driver_client()
        return {partition: last_position(client, partition) for partition in self._partitions()}

    def _advance(
        self, begin: dict[str, Position], latest: dict[str, Position], budget: int
    ) -> dict[str, Position]:
        """Ends that hold at most ``budget`` messages in all, shared evenly among the
        partitions that have messages; a partition's unused share goes to the others."""
        end = dict(begin)
        pending = sorted(p for p in latest if latest[p] > begin[p])
        while budget > 0 and pending:
            share = max(1, budget // len(pending))
            more = []
            for partition in pending:
                take = min(share, budget)
                if take == 0:
                    break
                moved, end[partition] = self._scan(
                    partition, end[partition], latest[partition], take
                )
                budget -= moved
                if moved == take:
                    more.append(partition)
            pending = more
        return end

    def _scan(
        self, partition: str, start: Position, end: Position, count: int
    ) -> tuple[int, Position]:
        """How many of the next ``count`` messages after ``start`` exist up to ``end``,
        and the position after them (``end`` when the range holds fewer)."""
        messages = read_range(
            self._driver_client(), RangePartition(partition, start, end), self._settings
        )
        moved, position = 0, start
        try:
            for _message, message_id in messages:
                moved += 1
                position = position_of(message_id)
                if moved == count:
                    return moved, position
        finally:
            messages.close()
        # Read to its end: the end, past any messages the time filter skipped.
        return moved, end

    # --- executors ----------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_batches(partition, self._settings)
