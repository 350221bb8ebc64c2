"""PySpark Python Data Source ``pulsar`` (batch and streaming), and function replay.

    from magnetar.spark_connector import PulsarDataSource
    spark.dataSource.register(PulsarDataSource)
    df = (spark.read.format("pulsar")
          .option("service.url", "pulsar://localhost:6650").option("topic", "t").load())

See :class:`PulsarDataSource` for the options and columns, :func:`replay` for running a
function's code over a stretch of history.

Names are imported on first use: Spark's Python workers import this package to unpickle the
data source, and every worker of every query would otherwise pay for the replay machinery
(Magnetar's function instance) that only :func:`replay` needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from magnetar.spark_connector._files import FILE_FORMATS, write_files
    from magnetar.spark_connector._options import check_read_options
    from magnetar.spark_connector._replay import (
        REPLAY_SCHEMA,
        ReplayProgress,
        ReplayReport,
        replay,
    )
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

_HOMES = {
    "FILE_FORMATS": "_files",
    "write_files": "_files",
    "check_read_options": "_options",
    "REPLAY_SCHEMA": "_replay",
    "ReplayProgress": "_replay",
    "ReplayReport": "_replay",
    "replay": "_replay",
    "SCHEMA": "_schema",
    "SCHEMA_REGISTRY_TOPIC": "_schema_lookup",
    "spark_session": "_session",
    "PulsarDataSource": "_source",
    "InvalidOptionError": "exceptions",
    "PulsarReadError": "exceptions",
    "PulsarWriteError": "exceptions",
    "ReplayError": "exceptions",
    "SchemaError": "exceptions",
    "SparkConnectorError": "exceptions",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
