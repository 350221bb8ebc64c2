"""The data source Spark sees: ``format("pulsar")`` for reading and writing.

Spark calls ``schema()`` in a Python worker when a read is loaded, then pickles this object
and hands it to the workers that plan the query: the topics' schema is looked up once, there,
and travels with it.
"""

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
from magnetar.spark_connector._catalog import admin_client, topics_of
from magnetar.spark_connector._client import shared_client
from magnetar.spark_connector._options import (
    SourceOptions,
    parse_sink_options,
    parse_source_options,
)
from magnetar.spark_connector._schema import source_schema
from magnetar.spark_connector._schema_lookup import SchemaSource
from magnetar.spark_connector._stream import PulsarStreamReader
from magnetar.spark_connector._topic_schema import NO_SCHEMA, TopicSchema
from magnetar.spark_connector._writer import PulsarBatchWriter, PulsarStreamWriter
from magnetar.spark_connector.exceptions import SchemaError

__all__ = ["PulsarDataSource"]


class PulsarDataSource(DataSource):
    """Apache Pulsar topics as a Spark data source named ``pulsar``, with the options, columns
    and behaviour of StreamNative's pulsar-spark connector.

    Register it once per session, then read and write::

        spark.dataSource.register(PulsarDataSource)
        df = (spark.read.format("pulsar")
              .option("service.url", "pulsar://localhost:6650")
              .option("topic", "orders")
              .load())

    Reading: ``service.url``; one of ``topic``, ``topics`` (comma-separated) or
    ``topicsPattern`` (a regular expression over topic names; needs ``admin.url``);
    ``startingOffsets`` (``earliest``, the batch default; ``latest``, the streaming default;
    or JSON ``{"<topic>": [MessageId.serialize() bytes]}``, that message included, where
    ``MessageId.earliest`` / ``MessageId.latest`` also serve); ``endingOffsets`` (batch only:
    ``latest``, the default, re-read at every evaluation, or JSON); ``startingTime`` /
    ``endingTime`` (publish time in ms, or JSON per topic); ``failOnDataLoss`` (default false
    as StreamNative's: a range that cannot be read to its end logs a warning); ``pollTimeoutMs``
    (default 120000); ``maxRecordsPerTrigger`` and ``maxBytesPerTrigger`` (streaming; bytes
    with ``admin.url``, as StreamNative); ``admin.url`` (topics for ``topicsPattern``, topic
    existence, schemas); ``predefinedSubscription`` / ``subscriptionPrefix`` (the
    subscriptions a streaming query keeps at its progress); ``waitingForNonExistedTopic``;
    ``allowDifferentTopicSchemas`` (values as bytes); ``schema.type`` / ``schema.definition``
    (the values' schema where the broker has none); ``pulsar.client.*``, ``pulsar.admin.*``
    and ``pulsar.reader.*`` (Java client field names).

    Columns: the value typed by the topics' schema (``value`` of bytes without one, of its
    type for a primitive schema; one column per field for JSON and AVRO), then ``__key``
    (binary), ``__topic``, ``__messageId`` (binary, ``MessageId.serialize()``),
    ``__publishTime``, ``__eventTime`` (null when unset), ``__messageProperties``.

    Writing (``mode("append")``: Spark lets Python data sources append or overwrite, and
    Pulsar topics cannot be overwritten): ``service.url``, ``topic`` or a ``__topic`` column;
    ``__key``, ``__eventTime``, ``__messageProperties`` become message metadata and the other
    columns the value, encoded by the topic's schema (or, for a topic without one, as
    StreamNative does: one column by its type, several as an AVRO record);
    ``pulsar.producer.*``. Writes are at-least-once: a retried Spark task sends its rows again.
    """

    @classmethod
    def name(cls) -> str:
        return "pulsar"

    def schema(self) -> StructType:
        options = parse_source_options(self.options, "any")
        self._topic_schema = _topic_schema(options)
        return source_schema(self._topic_schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_source_options(self.options, "batch")
        return PulsarBatchReader(options, self._checked(options, schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_source_options(self.options, "stream")
        return PulsarStreamReader(options, self._checked(options, schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return PulsarBatchWriter(parse_sink_options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return PulsarStreamWriter(parse_sink_options(self.options), schema, overwrite)

    def _checked(self, options: SourceOptions, schema: StructType) -> TopicSchema:
        """The topics' schema, looked up unless ``schema()`` did; a schema the user gave must
        be the one it implies (as StreamNative)."""
        topic_schema: TopicSchema | None = getattr(self, "_topic_schema", None)
        if topic_schema is None:
            topic_schema = _topic_schema(options)
        expected = source_schema(topic_schema)
        if schema != expected:
            raise SchemaError(
                "The Schema of Pulsar source and provided doesn't match: the topics give "
                f"{expected.simpleString()}, the query asked for {schema.simpleString()} "
                "(set schema.type / schema.definition to give the values' schema)"
            )
        return topic_schema


def _topic_schema(options: SourceOptions) -> TopicSchema:
    if options.allow_different_topic_schemas:
        return NO_SCHEMA
    if options.schema is not None:
        return options.schema
    admin = admin_client(options)
    source = SchemaSource(
        shared_client(options.service_url, options.client_conf), options.service_url, admin
    )
    return source.common_schema(topics_of(options, admin))
