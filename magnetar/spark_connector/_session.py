"""A Spark session ready to read Pulsar, for the CLI, scripts and notebooks."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from magnetar.spark_connector._source import PulsarDataSource

__all__ = ["spark_session"]


def spark_session(
    master: str = "local[*]",
    app_name: str = "magnetar",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """The active Spark session, or a new one on ``master``, with ``pulsar`` registered.

    Python workers run this interpreter unless ``PYSPARK_PYTHON`` says otherwise, so they
    import the same Magnetar and pulsar-client as the driver.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.dataSource.register(PulsarDataSource)
    return spark
