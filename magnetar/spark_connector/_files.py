"""A Pulsar DataFrame (read or replayed) written as files."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as sf
from pyspark.sql.types import ArrayType, BinaryType, MapType, StructType

from magnetar.spark_connector._schema import MESSAGE_ID
from magnetar.spark_connector.exceptions import InvalidOptionError

__all__ = ["FILE_FORMATS", "write_files"]

FILE_FORMATS = ("parquet", "json", "csv")


def write_files(df: DataFrame, path: str, file_format: str = "parquet") -> None:
    """Write ``df`` to the directory ``path``, which must not exist yet.

    Parquet keeps every column as it is. JSON and CSV are for reading by people and text
    tools: payloads and keys are written as UTF-8 text, ``__messageId`` as base64, and for
    CSV, which has no nested values, maps, structs and arrays (``__messageProperties``, the
    fields of a JSON or AVRO value) as JSON.
    """
    if file_format not in FILE_FORMATS:
        raise InvalidOptionError(
            f"file format {file_format!r} is not supported; use one of {', '.join(FILE_FORMATS)}"
        )
    if file_format != "parquet":
        df = df.select([_as_text(df, name, file_format) for name in df.columns])
    writer = df.write.mode("errorifexists")
    if file_format == "csv":
        writer = writer.option("header", "true")
    writer.format(file_format).save(path)


def _as_text(df: DataFrame, name: str, file_format: str) -> Column:
    column = sf.col(f"`{name}`")
    data_type = df.schema[name].dataType
    if isinstance(data_type, BinaryType):
        text = sf.base64(column) if name == MESSAGE_ID else column.cast("string")
        return text.alias(name)
    if isinstance(data_type, (MapType, StructType, ArrayType)) and file_format == "csv":
        return sf.to_json(column).alias(name)
    return column
