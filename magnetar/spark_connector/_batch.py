"""Batch reads: one Spark partition per topic partition, planned on the driver.

Explicit bounds are fixed when the query is planned. A "latest" end is looked up by each
task when it runs: Spark plans a DataFrame's partitions once and reuses them for every
action on it, and a re-evaluated DataFrame must see the messages that came since.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence

import pulsar
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from magnetar.spark_connector._catalog import admin_client, partitions_of, topics_of
from magnetar.spark_connector._client import last_position, shared_client
from magnetar.spark_connector._native import (
    LIBRARY,
    native_available,
    native_batches,
    native_refusal,
)
from magnetar.spark_connector._offsets import BEFORE_EARLIEST, ENTRY_END, Position
from magnetar.spark_connector._options import EARLIEST, LATEST, Bound, SourceOptions, TimeBound
from magnetar.spark_connector._ranges import RangePartition, ReadSettings, read_range
from magnetar.spark_connector._schema import record_batches
from magnetar.spark_connector._topic_schema import TopicSchema
from magnetar.spark_connector._values import ValueDecoder
from magnetar.spark_connector.exceptions import PulsarReadError
from magnetar.topics import base_topic

__all__ = ["PulsarBatchReader", "bound_for", "read_batches", "read_settings", "time_for"]

log = logging.getLogger(__name__)


def read_settings(options: SourceOptions, schema: TopicSchema) -> ReadSettings:
    """What executors need to know of the options."""
    return ReadSettings(
        service_url=options.service_url,
        client_conf=options.client_conf,
        reader_conf=options.reader_conf,
        poll_timeout_ms=options.poll_timeout_ms,
        fail_on_data_loss=options.fail_on_data_loss,
        subscription_prefix=options.subscription_prefix,
        schema=schema,
        read_path=options.read_path,
    )


class PulsarBatchReader(DataSourceReader):
    """``spark.read.format("pulsar")``: the messages between the starting and ending bounds."""

    def __init__(self, options: SourceOptions, schema: TopicSchema) -> None:
        self._options = options
        self._settings = read_settings(options, schema)

    def partitions(self) -> Sequence[RangePartition]:
        options = self._options
        client = shared_client(options.service_url, options.client_conf)
        topics = topics_of(options, admin_client(options))
        parts = []
        for partition in partitions_of(client, topics):
            start = bound_for(options.starting, partition, EARLIEST)
            end = bound_for(options.ending, partition, LATEST)
            parts.append(
                RangePartition(
                    partition,
                    BEFORE_EARLIEST if not isinstance(start, tuple) else start,
                    self._checked_end(client, partition, end) if isinstance(end, tuple) else None,
                    time_for(options.starting_time, partition),
                    time_for(options.ending_time, partition),
                )
            )
        return parts

    def _checked_end(self, client: pulsar.Client, partition: str, end: Position) -> Position:
        """An end given as a message id must exist: past the last message there is nothing
        to wait for (StreamNative would wait ``pollTimeoutMs`` and fail)."""
        last = last_position(client, partition)
        if end <= last or (end[2] == ENTRY_END and end[:2] <= last[:2]):
            return end
        text = (
            f"endingOffsets for {partition} is {end[:2]}, after its last message "
            f"{last if last != BEFORE_EARLIEST else '(none: the topic is empty)'}"
        )
        if self._options.fail_on_data_loss:
            raise PulsarReadError(f"{text}; set failOnDataLoss=false to read what is there")
        log.warning("%s; reading to the last message (failOnDataLoss=false)", text)
        return last

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_batches(partition, self._settings)


def read_batches(partition: RangePartition, settings: ReadSettings) -> Iterator[pa.RecordBatch]:
    """Read one range on an executor, natively unless ``magnetar.readPath`` says otherwise
    (see :mod:`._native`)."""
    client = shared_client(settings.service_url, settings.client_conf)
    decoder = ValueDecoder(settings.schema)
    if settings.read_path == "python":
        yield from record_batches(read_range(client, partition, settings), partition.topic, decoder)
        return
    if settings.read_path == "native":
        _require_native(settings)
    yield from native_batches(client, partition, settings, decoder)


def _require_native(settings: ReadSettings) -> None:
    """``magnetar.readPath=native``: the native reader, or an error that says why not."""
    if not native_available():
        raise PulsarReadError(
            f"magnetar.readPath is native but the native reader is not built ({LIBRARY} "
            "is missing: run `make install` with Rust's cargo on the PATH)"
        )
    refusal = native_refusal(settings)
    if refusal is not None:
        raise PulsarReadError(
            f"magnetar.readPath is native but the native reader does not support {refusal}"
        )


def bound_for(bound: Bound, partition: str, default: str) -> Position | str:
    """A bound for one topic partition: a position, or "earliest"/"latest" (``default`` for
    a partition the JSON leaves out); a bound given for a partitioned topic applies to each
    of its partitions."""
    if not isinstance(bound, Mapping):
        return bound
    return bound.get(partition, bound.get(base_topic(partition), default))


def time_for(time: TimeBound, partition: str) -> int | None:
    """A publish-time bound for one topic partition."""
    if isinstance(time, Mapping):
        return time.get(partition, time.get(base_topic(partition)))
    return time
