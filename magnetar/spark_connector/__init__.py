"""PySpark Python Data Source ``pulsar`` (batch and streaming), and function replay.

    from magnetar.spark_connector import PulsarDataSource
    spark.dataSource.register(PulsarDataSource)
    df = (spark.read.format("pulsar")
          .option("service.url", "pulsar://localhost:6650").option("topic", "t").load())

See :class:`PulsarDataSource` for the options and columns, :func:`replay` for running a
function's code over a stretch of history.
"""

from magnetar.spark_connector._files import FILE_FORMATS, write_files
from magnetar.spark_connector._options import check_read_options
from magnetar.spark_connector._replay import REPLAY_SCHEMA, ReplayProgress, ReplayReport, replay
from magnetar.spark_connector._schema import SCHEMA
from magnetar.spark_connector._schema_lookup import SCHEMA_REGISTRY_TOPIC
from magnetar.spark_connector._session import spark_session
from magnetar.spark_connector._source import PulsarDataSource
from magnetar.spark_connector.exceptions import (
    InvalidOptionError,
    PulsarReadError,
    PulsarWriteError,
    ReplayError,
    SchemaError,
    SparkConnectorError,
)

__all__ = [
    "FILE_FORMATS",
    "REPLAY_SCHEMA",
    "SCHEMA",
    "SCHEMA_REGISTRY_TOPIC",
    "InvalidOptionError",
    "PulsarDataSource",
    "PulsarReadError",
    "PulsarWriteError",
    "ReplayError",
    "ReplayProgress",
    "ReplayReport",
    "SchemaError",
    "SparkConnectorError",
    "check_read_options",
    "replay",
    "spark_session",
    "write_files",
]
