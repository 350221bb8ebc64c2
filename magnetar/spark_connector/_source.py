"""The data source Spark sees: ``format("pulsar")`` for reading and writing."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from magnetar.spark_connector._batch import PulsarBatchReader
from magnetar.spark_connector._options import parse_sink_options, parse_source_options
from magnetar.spark_connector._schema import SCHEMA
from magnetar.spark_connector._stream import PulsarStreamReader
from magnetar.spark_connector._writer import PulsarBatchWriter, PulsarStreamWriter

__all__ = ["PulsarDataSource"]


class PulsarDataSource(DataSource):
    """Apache Pulsar topics as a Spark data source named ``pulsar``.

    Register it once per session, then read and write with the options of the StreamNative
    pulsar-spark connector::

        spark.dataSource.register(PulsarDataSource)
        df = (spark.read.format("pulsar")
              .option("service.url", "pulsar://localhost:6650")
              .option("topic", "orders")
              .load())

    Reading: ``service.url``; ``topic`` or ``topics`` (comma-separated); ``startingOffsets``
    (``earliest``, the batch default; ``latest``, the streaming default; or JSON
    ``{"<topic>": [MessageId.serialize() bytes]}``, that message included, other topics
    starting at the default); ``endingOffsets`` (batch only: ``latest``, the default, or
    JSON, that message included); ``startingTime`` / ``endingTime`` (publish time in ms:
    at or after / before; instead of the offsets; ``endingTime`` batch only);
    ``failOnDataLoss`` (default true: fail when a range cannot be read to its end, e.g.
    messages deleted by retention; false reads what is there); ``pollTimeoutMs`` (default
    120000: how long a read waits for a message known to exist); ``maxRecordsPerTrigger``
    (streaming, PySpark 4.2+: at most this many messages per micro-batch, shared among the
    topics); ``pulsar.client.*`` (``authPluginClassName``, ``authParams``, TLS settings,
    ``operationTimeoutMs``, ``connectionTimeoutMs``, ``listenerName``, ``ioThreads``) and
    ``pulsar.reader.receiverQueueSize``. A batch read has one Spark partition per topic
    partition; a streaming offset is the last message id read of each.

    Columns: ``value`` (binary), ``__key`` (binary), ``__topic``, ``__messageId`` (binary,
    ``MessageId.serialize()``), ``__publishTime``, ``__eventTime`` (null when unset),
    ``__messageProperties`` (map<string,string>).

    Writing: ``service.url``, and ``topic`` or a ``__topic`` column (the option wins);
    ``value`` (string or binary), and optionally ``__key``, ``__eventTime`` and
    ``__messageProperties``. Writes are at-least-once: a retried Spark task sends its rows
    again.
    """

    @classmethod
    def name(cls) -> str:
        return "pulsar"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return PulsarBatchReader(parse_source_options(self.options, "batch"))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return PulsarStreamReader(parse_source_options(self.options, "stream"))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return PulsarBatchWriter(parse_sink_options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return PulsarStreamWriter(parse_sink_options(self.options), schema, overwrite)
