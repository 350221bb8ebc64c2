"""Batch reads: one Spark partition per topic partition, bounded on the driver."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from magnetar.spark_connector._client import last_position, open_client, topic_partitions
from magnetar.spark_connector._offsets import BEFORE_EARLIEST, Position
from magnetar.spark_connector._options import EARLIEST, Bound, SourceOptions
from magnetar.spark_connector._ranges import RangePartition, ReadSettings, read_range
from magnetar.spark_connector._schema import record_batches

__all__ = ["PulsarBatchReader", "read_batches", "read_settings"]


def read_settings(options: SourceOptions) -> ReadSettings:
    """What executors need to know of the options."""
    return ReadSettings(
        service_url=options.service_url,
        client_conf=options.client_conf,
        poll_timeout_ms=options.poll_timeout_ms,
        fail_on_data_loss=options.fail_on_data_loss,
        starting_time=options.starting_time,
        ending_time=options.ending_time,
        receiver_queue_size=options.receiver_queue_size,
    )


class PulsarBatchReader(DataSourceReader):
    """``spark.read.format("pulsar")``: the messages between the starting and ending bounds,
    as they are when the query is planned."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._settings = read_settings(options)

    def partitions(self) -> Sequence[RangePartition]:
        options = self._options
        client = open_client(options.service_url, options.client_conf)
        try:
            parts = []
            for topic in options.topics:
                for partition in topic_partitions(client, topic):
                    start = _bound(options.starting, partition) or BEFORE_EARLIEST
                    end = _bound(options.ending, partition) or last_position(client, partition)
                    parts.append(RangePartition(partition, start, end))
        finally:
            client.close()
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_batches(partition, self._settings)


def read_batches(partition: RangePartition, settings: ReadSettings) -> Iterator[pa.RecordBatch]:
    """Read one range on an executor, with a client of its own."""
    client = open_client(settings.service_url, settings.client_conf)
    try:
        yield from record_batches(read_range(client, partition, settings), partition.topic)
    finally:
        client.close()


def _bound(bound: Bound, partition: str) -> Position | None:
    """A bound for one topic partition; None for the default (the earliest as a start,
    the last message now as an end)."""
    if bound == EARLIEST:
        return BEFORE_EARLIEST
    if isinstance(bound, dict):
        return bound.get(partition)
    return None
