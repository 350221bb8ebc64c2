"""Errors of the Spark connector.

MagnetarError
 +-- SparkConnectorError
      +-- InvalidOptionError      a data source option is missing, unknown or malformed
      +-- PulsarReadError         a range could not be read completely (data loss, broker)
      +-- PulsarWriteError        rows could not be written to Pulsar
      +-- SchemaError             a topic's schema cannot be used, or data does not fit it
      +-- ReplayError             a function replay could not run
"""

from magnetar.exceptions import MagnetarError

__all__ = [
    "InvalidOptionError",
    "PulsarReadError",
    "PulsarWriteError",
    "ReplayError",
    "SchemaError",
    "SparkConnectorError",
]


class SparkConnectorError(MagnetarError):
    """Base class of the Spark connector's errors."""


class InvalidOptionError(SparkConnectorError, ValueError):
    """A data source option is missing, unknown or malformed; the message names the option
    and what it accepts."""


class PulsarReadError(SparkConnectorError):
    """A topic range could not be read to its end (messages gone, or the broker stopped
    answering within ``pollTimeoutMs``) while ``failOnDataLoss`` is true."""


class PulsarWriteError(SparkConnectorError):
    """Rows could not be written: a bad row, or the broker did not persist a message."""


class ReplayError(SparkConnectorError):
    """A function replay could not start (no code, a bad range, an unusable sink)."""


class SchemaError(SparkConnectorError, ValueError):
    """A topic's schema cannot be used (a type Spark cannot hold, topics read together with
    different schemas), or rows do not fit the schema of the topic they are written to."""
