"""Structured Streaming: offsets are the last message id read per topic partition.

A micro-batch reads ``(start, end]`` of every topic partition, so a query restarted from its
checkpoint reads exactly what follows its last committed offsets. The driver-side reader
lives in one long-lived Python process per query, so it keeps its client there; with
``maxRecordsPerTrigger`` or ``maxBytesPerTrigger`` it reads ahead from each start to find
where the batch ends. Topics matched by ``topicsPattern`` are looked for again at every
trigger; a partition that appears starts at its earliest message (as StreamNative).

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

from magnetar.spark_connector._batch import bound_for, read_batches, read_settings, time_for
from magnetar.spark_connector._catalog import admin_client, partitions_of, topics_of
from magnetar.spark_connector._client import last_position, open_client
from magnetar.spark_connector._cursor import ProgressCursor
from magnetar.spark_connector._offsets import (
    BEFORE_EARLIEST,
    Position,
    decode_offset,
    encode_offset,
    position_of,
)
from magnetar.spark_connector._options import EARLIEST, LATEST, SourceOptions
from magnetar.spark_connector._ranges import RangePartition, read_range
from magnetar.spark_connector._topic_schema import TopicSchema

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

    def __init__(self, options: SourceOptions, schema: TopicSchema) -> None:
        self._options = options
        self._settings = read_settings(options, schema)
        self._client: pulsar.Client | None = None
        self._cursor: ProgressCursor | None = None
        self._initial: dict[str, list[int]] | None = None
        self._target: dict[str, Position] | None = None

    # --- driver -------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, list[int]]:
        # Spark asks more than once; "latest" must mean the same moment every time.
        if self._initial is None:
            positions: dict[str, Position] = {}
            partitions = self._partitions()
            for partition in partitions:
                start = bound_for(self._options.starting, partition, LATEST)
                if start == EARLIEST:
                    positions[partition] = BEFORE_EARLIEST
                elif start == LATEST:
                    positions[partition] = last_position(self._driver_client(), partition)
                else:
                    assert isinstance(start, tuple)
                    positions[partition] = start
            self._progress().open(partitions)
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
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        budget_bytes = self._options.max_bytes_per_trigger
        if rows is not None or budget_bytes is not None:
            begun = {p: begin.get(p, BEFORE_EARLIEST) for p in latest}
            end = {**end, **self._advance(begun, latest, rows, budget_bytes)}
        return encode_offset(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[RangePartition]:
        begin, finish = decode_offset(start), decode_offset(end)
        return [
            RangePartition(
                topic,
                begin.get(topic, BEFORE_EARLIEST),
                position,
                time_for(self._options.starting_time, topic),
            )
            for topic, position in sorted(finish.items())
            if position > begin.get(topic, BEFORE_EARLIEST)
        ]

    def commit(self, end: dict[str, Any]) -> None:
        """The offsets live in Spark's checkpoint; the broker's subscriptions follow them."""
        self._progress().commit(decode_offset(end))

    def stop(self) -> None:
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def _driver_client(self) -> pulsar.Client:
        if self._client is None:
            self._client = open_client(self._options.service_url, self._options.client_conf)
        return self._client

    def _progress(self) -> ProgressCursor:
        if self._cursor is None:
            self._cursor = ProgressCursor(
                self._driver_client(),
                self._options.predefined_subscription,
                self._options.subscription_prefix,
            )
        return self._cursor

    def _partitions(self) -> list[str]:
        topics = topics_of(self._options, admin_client(self._options))
        return partitions_of(self._driver_client(), topics)

    def _latest(self) -> dict[str, Position]:
        client = self._driver_client()
        return {partition: last_position(client, partition) for partition in self._partitions()}

    def _advance(
        self,
        begin: dict[str, Position],
        latest: dict[str, Position],
        rows: int | None,
        budget_bytes: int | None,
    ) -> dict[str, Position]:
        """Ends that hold at most ``rows`` messages and about ``budget_bytes`` payload bytes
        (a soft limit: at least one message) in all, shared evenly among the partitions that
        have messages; a partition's unused share goes to the others."""
        end = dict(begin)
        budget = _Budget(rows, budget_bytes)
        pending = sorted(p for p in latest if latest[p] > begin[p])
        while budget.left() and pending:
            more = []
            share = budget.share(len(pending))
            for partition in pending:
                if not budget.left():
                    break
                moved, end[partition] = self._scan(
                    partition, end[partition], latest[partition], share.limited(budget)
                )
                budget.spend(moved)
                if moved.full:
                    more.append(partition)
            pending = more
        return end

    def _scan(
        self, partition: str, start: Position, end: Position, limit: _Budget
    ) -> tuple[_Spent, Position]:
        """Messages after ``start`` up to ``end`` within ``limit``, and the position after
        them (``end`` when the range holds less)."""
        chunks = read_range(
            self._driver_client(), RangePartition(partition, start, end), self._settings, 256
        )
        spent = _Spent()
        try:
            for chunk in chunks:
                for message, serialized_id in zip(*chunk, strict=True):
                    spent.rows += 1
                    spent.bytes += message.length()
                    if limit.reached(spent):
                        spent.full = True
                        return spent, position_of(pulsar.MessageId.deserialize(serialized_id))
        finally:
            chunks.close()
        # Read to its end: the end, past any messages the time filter skipped.
        return spent, end

    # --- executors ----------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_batches(partition, self._settings)


class _Spent:
    """What a scan took."""

    def __init__(self) -> None:
        self.rows = 0
        self.bytes = 0
        self.full = False
        """Whether the scan stopped at its limit (the partition may have more)."""


class _Budget:
    """Rows and bytes a micro-batch may still take (None: no limit of that kind)."""

    def __init__(self, rows: int | None, size: int | None) -> None:
        self.rows = rows
        self.bytes = size

    def left(self) -> bool:
        return (self.rows is None or self.rows > 0) and (self.bytes is None or self.bytes > 0)

    def share(self, ways: int) -> _Budget:
        return _Budget(
            None if self.rows is None else max(1, self.rows // ways),
            None if self.bytes is None else max(1, self.bytes // ways),
        )

    def limited(self, total: _Budget) -> _Budget:
        """This share, but never more than what is left in ``total``."""
        return _Budget(
            None if self.rows is None else min(self.rows, total.rows or 0),
            None if self.bytes is None else min(self.bytes, total.bytes or 0),
        )

    def reached(self, spent: _Spent) -> bool:
        return (self.rows is not None and spent.rows >= self.rows) or (
            self.bytes is not None and spent.bytes >= self.bytes
        )

    def spend(self, spent: _Spent) -> None:
        if self.rows is not None:
            self.rows -= spent.rows
        if self.bytes is not None:
            self.bytes -= spent.bytes
